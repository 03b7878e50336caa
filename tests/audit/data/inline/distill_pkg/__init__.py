"""A self-distillation trainer package: its step imports a helper relatively and reads the teacher's
log-probs from a server."""
