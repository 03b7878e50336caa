"""check-grad on a KL term written inline in a training step: the lint's slice, cut out as a function."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from klaudit.audit.inline import inline_slices

STEP = Path(__file__).parent / "data" / "inline" / "grpo_step.py"


def test_the_slice_is_the_kl_statements_with_inputs_bound_by_role_and_switches_as_parameters():
    (piece,), failures = inline_slices(str(STEP))
    assert failures == [] and piece.qualname == "StepTrainer.training_step" and piece.placement == "loss"
    assert (piece.first, piece.last) == (25, 39)  # from the old log-probs to the importance-weighted KL
    namespace: dict = {}
    exec(compile(piece.source, "slice", "exec"), namespace)  # noqa: S102 - klaudit's own generated code
    parameters = inspect.signature(namespace[piece.name]).parameters
    assert {name: p.default for name, p in parameters.items() if p.default is not p.empty} == {
        "ratio_level": "token", "kl_importance_correction": True}
    assert set(parameters) - {"ratio_level", "kl_importance_correction"} == {
        "per_token_logps", "ref_per_token_logps", "old_per_token_logps", "response_mask"}
    called = {node.func.attr for node in ast.walk(ast.parse(piece.source))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert "backward" not in called and "log_softmax" not in called  # nothing after the KL, no model


def test_a_value_that_neither_is_arithmetic_nor_binds_is_reported(tmp_path):
    source = STEP.read_text().replace(
        "        if self.kl_coef > 0:\n            token_kl = torch.exp(",
        "        shift = self.reference_shift(batch)\n        if self.kl_coef > 0:\n            token_kl = shift * torch.exp(")
    (tmp_path / "step.py").write_text(source)
    slices, (failure,) = inline_slices(str(tmp_path / "step.py"))
    assert slices == [] and "StepTrainer.training_step" in failure
    assert "'shift' comes from outside the step's arithmetic and does not bind by its name" in failure


def test_check_grad_audits_the_inline_term_on_policy_and_names_the_original_lines():
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    report = run([str(STEP)])
    assert report.errors == []
    rows = {(row.mode["ratio_level"], row.mode["kl_importance_correction"]): row for row in report.results}
    assert {row.target for row in report.results} == {f"{STEP}:25-39 (inline KL of StepTrainer.training_step)"}
    assert all(row.placement == "loss" and row.used for row in report.results)
    # ratio * k3 with the token ratio: PART, as k2 (kl-math.md row 2); k3 alone: PFWD (row 3)
    assert (rows["token", True].objective, rows["token", True].rule) == ("PART", "KL003")
    assert "ratio*k3 differentiated as a loss, token-sum, on-policy" in rows["token", True].same_gradient_as
    for key in (("token", False), ("sequence", False)):
        assert (rows[key].objective, rows[key].rule) == ("PFWD", "KL002")
    # the sequence ratio adds k3 x the sequence's score: k3 loss + k3 whole-sequence return = REV (rows 13, 6)
    assert rows["sequence", True].objective == "REV" and rows["sequence", True].unbiased


DISTILL = Path(__file__).parent / "data" / "inline" / "distill_pkg" / "trainer.py"
INDEXED = Path(__file__).parents[2] / "fixtures" / "bad" / "indexed_kl_estimator.py"


def _slices_of(path: Path) -> dict:
    slices, failures = inline_slices(str(path))
    assert failures == []
    return {piece.qualname: piece for piece in slices}


def _parameters(piece) -> dict:
    """{parameter: its default, or None} of the slice's function, read from its source."""
    function = next(node for node in ast.parse(piece.source).body
                    if isinstance(node, ast.FunctionDef) and node.name == piece.name)
    defaults = [ast.literal_eval(default) for default in function.args.defaults]
    names = [argument.arg for argument in function.args.args]
    return dict(zip(names, [None] * (len(names) - len(defaults)) + defaults))


def test_a_server_value_is_cut_where_it_gets_a_name_that_binds():
    """`teacher = self.teacher_server.score(inputs)` binds by no name; `teacher_per_token_logps =
    teacher["actual_logprobs"]` does (the reference's log-probs): that variable is the slice's parameter. The
    else branch, another estimator, is not part of the term; the helper imported relatively is imported by its
    package's name."""
    piece = _slices_of(DISTILL)["Distiller.server_step"]
    assert piece.placement == "loss"  # `per_token_loss` holds sg(student - teacher) * student: a loss
    assert "from distill_pkg.helpers import clip_ratio" in piece.source
    assert "topk_divergence" not in piece.source and "teacher[" not in piece.source
    assert _parameters(piece) == {"completion_ids": None, "student_logits": None, "teacher_per_token_logps": None,
                                  "old_per_token_logps": None, "mode": "sampled_token"}


def test_a_negated_estimate_in_an_advantage_is_returned_as_the_estimate():
    """`a_opd = sg(teacher - rollout)` is maximised as an advantage: the slice returns -a_opd, the k1 estimate
    check-grad audits as a reward placement, and reads the step's arguments that bind by name."""
    piece = _slices_of(DISTILL)["Distiller._advantage_loss"]
    assert piece.placement == "reward" and "-a_opd" in piece.source.splitlines()[-1]
    assert set(_parameters(piece)) == {"labels", "teacher_actual_logprobs", "rollout_logprobs"}


def test_estimators_stacked_and_indexed_by_a_switch_are_one_slice():
    """open-instruct's torch.stack([k1, k2, k3, ratio * k3])[kl_estimator]: every estimator's slice runs up to
    the statement that picks one, with the index as a parameter (audited at 0..3, klaudit.lint.query)."""
    slices, failures = inline_slices(str(INDEXED))
    assert failures == [] and len({piece.source for piece in slices}) == 1
    assert slices[0].source.rstrip().endswith("return kl") and "kl_estimator=True" in slices[0].source


def test_check_grad_audits_the_cut_out_distillation_terms():
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    report = run([str(DISTILL)])
    assert report.errors == []
    rows = {row.target.rsplit("of ", 1)[-1].rstrip(")"): row for row in report.results}
    # the sampled-token reverse KL: a k1 reward on its own token only (PART, row 2)
    server = rows["Distiller.server_step"]
    assert (server.objective, server.rule, server.mode) == ("PART", "KL003", {"mode": "sampled_token"})
    # the advantage's k1 values, as a reward with reward-to-go: REV (row 6); the same-token use is the caller's
    advantage = rows["Distiller._advantage_loss"]
    assert advantage.placement == "reward" and advantage.objective == "REV" and advantage.unbiased


LOGGED_AFTER_ENTRY = """\
import torch


def grpo_loss(model, batch, kl_adapter):
    logprobs = model(batch)
    ref_logp = batch["ref_logp"]
    ppo_loss_mask = batch["ppo_loss_mask"]
    loss = (-batch["advantages"] * logprobs).sum()
    ref_kl = ref_logp - logprobs
    kl_loss = torch.where(ppo_loss_mask, ref_kl.exp() - ref_kl - 1, 0.0).sum()
    loss += kl_adapter.value * kl_loss / ppo_loss_mask.count_nonzero()
    kl_loss = kl_loss.detach()
    return loss, kl_loss
"""


def test_the_slice_ends_where_the_term_enters_the_loss_and_a_boolean_mask_is_fed(tmp_path):
    # ReaLHF's GRPO example: kl_loss is detached for the logs after it entered the loss; the slice must not
    # return the detached copy (no gradient), and torch.where(mask, ...) wants the mask as booleans
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    (tmp_path / "step.py").write_text(LOGGED_AFTER_ENTRY)
    (piece,), failures = inline_slices(str(tmp_path / "step.py"))
    assert failures == [] and "detach" not in piece.source and (piece.first, piece.last) == (9, 10)
    report = run([str(tmp_path / "step.py")])
    assert report.errors == [] and [row.objective for row in report.results] == ["PFWD"]  # k3 as a loss, row 3
    assert any("ppo_loss_mask" in note and "a boolean mask (a float mask raised RuntimeError)" in note
               for note in report.notes)


HELPER_STEP = Path(__file__).parent / "data" / "inline" / "helper_step.py"


def test_a_helper_of_the_same_file_is_carried_into_the_slice_and_bound_at_the_call():
    """`kl = log_ratio(logprobs_new, logprobs_ref)`: the helper's own parameter names (`logprobs_old`) say
    nothing; the slice defines it in its header and binds the step's names. A helper reading a module
    constant is not carried (it would not run alone), nor one the KL term does not call."""
    (piece,), failures = inline_slices(str(HELPER_STEP))
    assert failures == [] and (piece.first, piece.last) == (22, 25)
    defined = [node.name for node in ast.parse(piece.source).body if isinstance(node, ast.FunctionDef)]
    assert defined == ["log_ratio", piece.name]
    assert set(_parameters(piece)) == {"input_ids", "ref_logits", "logprobs_new"}


def test_check_grad_audits_a_kl_formed_through_a_helper():
    """0.5 (logp - ref)^2 summed over tokens, differentiated as a loss: k2, the local term only (row 2, KL003)."""
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    report = run([str(HELPER_STEP)])
    (row,) = report.results
    assert report.errors == [] and (row.objective, row.rule) == ("PART", "KL003")
    assert row.configuration.startswith("k2 differentiated as a loss, token-sum")


def test_the_tests_around_a_statement_in_an_except_handler_are_found():
    """`_guards` searches every block a statement holds: a statement in an `except` handler inside an
    `if` has that `if`'s test (PhilSaad333/RL_Practice's step logged a failure in a handler after its KL term; the
    handler was not searched and the cut crashed)."""
    from klaudit.audit.inline import _guards

    function = ast.parse(
        "def step(self, probe):\n"
        "    if probe:\n"
        "        try:\n"
        "            self.finalize()\n"
        "        except Exception as error:\n"
        "            print(error)\n").body[0]
    handler_statement = function.body[0].body[0].handlers[0].body[0]
    assert [(ast.unparse(guard.test), side) for guard, side in _guards(function.body, handler_statement)] == [
        ("probe", "body")]
    assert _guards(function.body[0].body, function.body[0]) is None


def test_a_term_formed_in_a_match_case_is_cut_out(tmp_path):
    """A step that picks its estimator in a `match` statement: its cases are searched like an `if`'s branches
    (the `match` used to be kept whole, as if one statement that assigns no one variable)."""
    (tmp_path / "step.py").write_text(
        "import torch\n\n\n"
        "class Trainer:\n"
        "    def training_step(self, model, batch, logprobs, ref_logprobs, mask, estimator):\n"
        "        ref = ref_logprobs.detach()\n"
        "        match estimator:\n"
        "            case 'k3':\n"
        "                log_ratio = ref - logprobs\n"
        "                kl = log_ratio.exp() - 1 - log_ratio\n"
        "            case _:\n"
        "                kl = logprobs - ref\n"
        "        if self.kl_coef > 0:\n"
        "            loss = (kl * mask).sum() / mask.sum()\n"
        "            loss.backward()\n"
        "        return model\n")
    slices, failures = inline_slices(str(tmp_path / "step.py"))
    assert failures == [] and [piece.qualname for piece in slices] == ["Trainer.training_step"] * 2
    # the step's `estimator` is a switch of each slice, the first value it is matched with by default
    assert [_parameters(piece) for piece in slices] == [{"ref_logprobs": None, "logprobs": None, "estimator": "k3"}] * 2
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    report = run([str(tmp_path / "step.py")])
    # k3 as a loss follows the forward KL (row 3, KL002); k1 as a loss has no expected gradient (row 1, KL001); each
    # slice skips the value whose case does not form its term (the `match` used to be dropped from the slices)
    assert report.errors == [] and [(row.mode, row.objective, row.rule) for row in report.results] == [
        ({"estimator": "k3"}, "PFWD", "KL002"), ({"estimator": "other"}, "ZERO", "KL001")]
    assert any("(estimator='k3') raised NotImplementedError: the KL term is not formed" in note for note in report.notes)


ALIASED_CONFIG = '''import torch


class Trainer:
    def train(self, batch):
        args = self.args
        self.callbacks.on_train_begin(args)
        logprobs, ref_logprobs = batch["logprobs"], batch["ref_logprobs"]
        logr = ref_logprobs - logprobs
        kl = -logr if args.kl_estimator == "k1" else (logr.exp() - 1) - logr
        rewards = batch["scores"] - args.kl_coef * kl
        return rewards
'''


def test_a_setting_read_through_a_local_alias_of_instance_state_is_a_switch(tmp_path):
    """TRL 0.12-0.29's PPOTrainer.train: `args = self.args`, handed whole to the callbacks, then
    `args.kl_estimator`: the estimator is switched by the state's setting, k1 or k3 in the reward (rows 6 and 8),
    not by a flag named `args`."""
    (tmp_path / "trainer.py").write_text(ALIASED_CONFIG)
    slices, failures = inline_slices(str(tmp_path / "trainer.py"))  # the k1 line, and the estimator it is one of
    assert failures == [] and [_parameters(piece) for piece in slices] == [
        {"logprobs": None, "ref_logprobs": None}, {"logprobs": None, "ref_logprobs": None, "kl_estimator": "k1"}]
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    report = run([str(tmp_path / "trainer.py")])
    rows = {row.mode["kl_estimator"]: (row.objective, row.rule) for row in report.results if row.mode}
    assert report.errors == [] and rows == {"k1": ("REV", None), "other": ("OTHER", "KL004")}


DICT_CONFIG = '''import torch


class Trainer:
    def step(self, batch):
        new_logp, ref_logp, gen_mask = batch["new_logp"], batch["ref_logp"], batch["gen_mask"]
        loss = batch["pg_loss"]
        if self.cfg.get("kl_beta", 0.0) > 0.0:
            kl_tok = (new_logp - ref_logp) * gen_mask
            kl_mean = kl_tok.sum() / gen_mask.sum()
            loss = loss + self.cfg["kl_beta"] * kl_mean
        loss.backward()
'''


def test_a_dict_in_instance_state_gives_its_keys_as_coefficients_or_switches(tmp_path):
    """`self.cfg.get("kl_beta", 0.0) > 0.0` (PhilSaad333/RL_Practice's Dr. GRPO step): the key is a KL coefficient,
    1, not a switch parameter `get`; k1 as a loss, token-mean over the batch, has zero expected gradient (row 1)."""
    (tmp_path / "trainer.py").write_text(DICT_CONFIG)
    (piece,) = _slices_of(tmp_path / "trainer.py").values()
    assert _parameters(piece) == {"gen_mask": None, "new_logp": None, "ref_logp": None}
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    report = run([str(tmp_path / "trainer.py")])
    assert report.errors == [] and [(row.objective, row.rule) for row in report.results] == [("ZERO", "KL001")]


CONFIG_PARAMETER = '''import torch


def token_policy_loss(current_logprobs, completion_mask, credits, config, reference_logprobs=None):
    surrogate = current_logprobs * credits
    if config.kl_coefficient > 0:
        reference_log_ratio = reference_logprobs - current_logprobs
        kl = torch.exp(reference_log_ratio) - reference_log_ratio - 1.0
    else:
        kl = torch.zeros_like(current_logprobs)
    mask = completion_mask.float()
    token_loss = -(surrogate - config.kl_coefficient * kl) * mask
    if config.token_normalization == "per_response":
        loss = (token_loss.sum(dim=1) / mask.sum(dim=1)).mean()
    else:
        loss = token_loss.sum() / mask.sum()
    return loss
'''


def test_a_parameter_named_as_settings_gives_its_attributes_as_coefficients(tmp_path):
    """`def token_policy_loss(..., config)` reading `config.kl_coefficient` (meta-rlvr's token GRPO loss): the settings
    object is read as instance state is, its KL coefficient 1, so the k3 term is cut out and audited: k3 as a loss
    follows the forward KL (PFWD, KL002, kl-math.md section 8 row 3)."""
    (tmp_path / "losses.py").write_text(CONFIG_PARAMETER)
    (piece,) = _slices_of(tmp_path / "losses.py").values()
    assert _parameters(piece) == {"current_logprobs": None, "reference_logprobs": None}
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    report = run([str(tmp_path / "losses.py")])
    assert [(row.objective, row.rule) for row in report.results if "inline KL" in row.target] == [("PFWD", "KL002")]


BUFFER_STEP = '''import torch


class ReplayTrainer:
    def compute_loss(self, model, inputs):
        batch = self.buffer.drain()
        if len(batch.episodes) == 0:
            loss = next(model.parameters()).sum() * 0.0
        else:
            policy_logps, reference_logps = self.score(model, batch)
            gap = reference_logps - policy_logps
            kl = torch.exp(gap) - gap - 1
            loss = (-policy_logps * batch.advantages + self.kl_beta * kl).mean()
        return loss
'''


def test_a_guard_on_a_value_of_the_step_is_taken_on_the_side_that_forms_the_term(tmp_path):
    """`if len(batch.episodes) == 0: ... else:` (vine-verifiers' steps) decides whether the term is formed, not how:
    the slice takes the else side, where the test's `batch` used to stop the cut ("comes from outside the step's
    arithmetic"). k3 as a loss follows the forward KL: PFWD, KL002 (kl-math.md section 8 row 3)."""
    (tmp_path / "trainer.py").write_text(BUFFER_STEP)
    (piece,) = _slices_of(tmp_path / "trainer.py").values()
    assert _parameters(piece) == {"reference_logps": None, "policy_logps": None}
    assert "if False:" in piece.source and "batch" not in piece.source
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    report = run([str(tmp_path / "trainer.py")])
    assert report.errors == [] and [(row.objective, row.rule) for row in report.results] == [("PFWD", "KL002")]


def test_a_guard_holding_the_term_on_both_sides_is_not_taken(tmp_path):
    """A test on a value of the step with a kept statement on each side picks how the term is formed: no side is
    taken, and the cut fails with the name that does not bind."""
    source = BUFFER_STEP.replace("            loss = next(model.parameters()).sum() * 0.0\n",
                                 "            gap = batch.fallback_gap\n            loss = gap.sum() * 0.0\n")
    source = source.replace("            gap = reference_logps - policy_logps\n", "")
    source = source.replace("            policy_logps, reference_logps = self.score(model, batch)\n",
                            "            policy_logps, reference_logps = self.score(model, batch)\n"
                            "            gap = reference_logps - policy_logps\n")
    (tmp_path / "trainer.py").write_text(source)
    slices, failures = inline_slices(str(tmp_path / "trainer.py"))
    assert (slices, len(failures)) == ([], 1) and "'batch' comes from outside the step's arithmetic" in failures[0]


NORMALISED_SWITCH = '''import torch


def ppo_epoch(policy, rollout, optimizer, kl_form, kl_beta):
    kl_form = kl_form.strip().lower()
    new_lp = policy.token_logprobs(rollout.tokens)
    ref_lp = rollout.ref_lp
    ratio = torch.exp(new_lp - rollout.old_lp)
    pg = -(ratio * rollout.advantages)
    if kl_form == "k2":
        kl = 0.5 * (new_lp - ref_lp) ** 2
    else:
        kl = new_lp - ref_lp
    loss = ((pg + kl_beta * kl) * rollout.mask).sum() / rollout.mask.sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''


def test_a_parameter_of_the_step_compared_with_strings_is_a_switch_of_the_slice(tmp_path):
    """`kl_form` (prorl-on-noma's `variant`, `k2_mode`): a parameter the step compares with strings is a switch of
    the slice, its spelling made canonical first (`.strip().lower()`) left out; it used to stop the cut. k2 as a
    loss gives the local gradient only (PART, KL003, row 2); k1 as a loss has none in expectation (ZERO, KL001,
    row 1); each slice skips the value that does not form its term."""
    (tmp_path / "train.py").write_text(NORMALISED_SWITCH)
    slices, failures = inline_slices(str(tmp_path / "train.py"))
    assert failures == [] and [_parameters(piece) for piece in slices] == [
        {"new_lp": None, "ref_lp": None, "kl_form": "k2"}] * 2
    assert all("lower" not in piece.source for piece in slices)
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    report = run([str(tmp_path / "train.py")])
    assert report.errors == [] and [(row.mode, row.objective, row.rule) for row in report.results] == [
        ({"kl_form": "k2"}, "PART", "KL003"), ({"kl_form": "other"}, "ZERO", "KL001")]


PER_SAMPLE_ADVANTAGES = '''import torch


def compute_advantages(args, rollout_data):
    log_probs = rollout_data["log_probs"]
    if args.advantage_estimator == "on_policy_distillation":
        teacher_log_probs = rollout_data["teacher_log_probs"]
        advantages = [teacher - student for teacher, student in zip(teacher_log_probs, log_probs)]
    else:
        advantages = [torch.zeros_like(student) for student in log_probs]
    rollout_data["advantages"] = advantages
'''


def test_per_sample_advantages_of_a_teacher_are_cut_out_and_audited_on_their_own_tokens(tmp_path):
    """slime's on-policy distillation: per-sample lists of teacher - student log-probs, each token's own advantage.
    The comprehension's variables are no parameters of the slice, the negation is taken item by item, and the term
    is audited as each token's own advantage: k1 reaching only its own token's score is the local gradient (PART,
    KL003, kl-math.md section 8), what the lint reports."""
    (tmp_path / "loss.py").write_text(PER_SAMPLE_ADVANTAGES)
    (piece,) = _slices_of(tmp_path / "loss.py").values()
    assert piece.placement == "advantage"
    assert _parameters(piece) == {"log_probs": None, "teacher_log_probs": None,
                                  "advantage_estimator": "on_policy_distillation"}
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    report = run([str(tmp_path / "loss.py")])
    rows = [(row.mode, row.placement, row.objective, row.rule) for row in report.results]
    assert report.errors == [] and rows == [
        ({"advantage_estimator": "on_policy_distillation"}, "advantage", "PART", "KL003")]


SAMPLED_TOKENS_STEP = '''import torch
import torch.nn.functional as F


class Distiller:
    def compute_loss(self, model, inputs):
        sampled_token_ids = self.rollout_tokens(inputs)
        student_logits = model(inputs["input_ids"]).logits
        teacher_logits = self.teacher(inputs["input_ids"]).logits
        student_lp = torch.gather(F.log_softmax(student_logits, -1), -1, sampled_token_ids.unsqueeze(-1)).squeeze(-1)
        teacher_lp = torch.gather(F.log_softmax(teacher_logits, -1), -1, sampled_token_ids.unsqueeze(-1)).squeeze(-1)
        advantage = (teacher_lp - student_lp).detach()
        return -(advantage * student_lp).mean()
'''


def test_the_sampled_token_ids_bind_by_their_name(tmp_path):
    """OPSD's on-policy distillation gathers both models' log-probs at `sampled_token_ids` (the response's tokens):
    the name binds as the sampled tokens, so the term is cut out; teacher - student as each token's own advantage is
    k1 on its own token's score, the local gradient (PART, KL003, kl-math.md section 8 row 2)."""
    from klaudit.audit.bind import Role, role_from_name

    assert role_from_name("sampled_token_ids") is Role.TOKENS and role_from_name("generated_ids") is Role.TOKENS
    assert role_from_name("student_input_ids") is not Role.TOKENS  # prompt and response: no binding by name
    (tmp_path / "trainer.py").write_text(SAMPLED_TOKENS_STEP)
    (piece,) = _slices_of(tmp_path / "trainer.py").values()
    assert piece.placement == "advantage" and "sampled_token_ids" in _parameters(piece)
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    report = run([str(tmp_path / "trainer.py")])
    assert report.errors == [] and [(row.placement, row.objective, row.rule) for row in report.results] == [
        ("advantage", "PART", "KL003")]


FLAG_AND_DEFAULT_STEP = '''import torch


def train_step(policy, batch, optimizer, penalise: bool, estimator="k1"):
    new_lp = policy.token_logprobs(batch.tokens)
    ref_lp = batch.ref_lp
    loss = -(torch.exp(new_lp - batch.old_lp) * batch.advantages).mean()
    if penalise:
        log_ratio = new_lp - ref_lp
        kl = log_ratio if estimator == "k1" else torch.exp(-log_ratio) - 1 + log_ratio
        loss = loss + 0.1 * kl.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
'''


def test_a_flag_annotated_bool_and_a_string_default_of_the_step_are_switches_of_the_slice(tmp_path):
    """`penalise: bool` (True by default in the slice) and `estimator="k1"` (its default): the cut term is audited at
    each value the lint labels it with: k1 as a loss has no expected gradient (ZERO, KL001, row 1), k3 follows the
    forward KL (PFWD, KL002, row 3)."""
    (tmp_path / "train.py").write_text(FLAG_AND_DEFAULT_STEP)
    slices, failures = inline_slices(str(tmp_path / "train.py"))
    assert failures == [] and slices
    assert all(_parameters(piece) == {"new_lp": None, "ref_lp": None, "penalise": True, "estimator": "k1"}
               for piece in slices)
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    report = run([str(tmp_path / "train.py")])
    assert report.errors == [] and {(row.mode["estimator"], row.objective, row.rule) for row in report.results} == {
        ("k1", "ZERO", "KL001"), ("other", "PFWD", "KL002")}


def test_the_variables_of_a_comprehension_or_a_lambda_are_bound_there_not_read():
    from klaudit.audit.inline import _names_read

    tree = ast.parse("y = (lambda d: d + x)(z) + sum(t * w for t in rows)")
    assert _names_read([tree]) == {"x", "z", "w", "rows", "sum"}


TERNARY_STEP = """\
import torch


class Trainer:
    def compute_loss(self, model, inputs):
        per_token_logps = self._get_per_token_logps(model, inputs)
        ref_per_token_logps = inputs["ref_per_token_logps"]
        completion_mask = inputs["completion_mask"]
        delta = ref_per_token_logps - per_token_logps
        per_token_kl = (torch.exp(delta) - delta - 1) if self.args.use_k3 else -delta
        loss = self.beta * ((per_token_kl * completion_mask).sum(-1) / completion_mask.sum(-1)).mean()
        return loss
"""


def test_a_term_choosing_between_two_estimators_is_audited_once_per_switch_value(tmp_path):
    """The lint reports an origin for each estimator of `k3 if use_k3 else k1`; both cut out the same function,
    which check-grad runs once: k3 as a loss follows PFWD (KL002), k1 has zero expected gradient (KL001)."""
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    (tmp_path / "step.py").write_text(TERNARY_STEP)
    slices, failures = inline_slices(str(tmp_path / "step.py"))
    assert failures == [] and len(slices) == 2 and len({piece.source for piece in slices}) == 1
    report = run([str(tmp_path / "step.py")])
    assert report.errors == []
    assert sorted((row.mode["use_k3"], row.objective, row.rule) for row in report.results) == [
        (False, "ZERO", "KL001"), (True, "PFWD", "KL002")]


NANO_AHA_STEP = """\
import torch


def compute_pg_loss(policy_model, batch, total_response_len, KL_COEFFICIENT):
    labels_mask = batch["labels_mask"]
    ref_logps = batch["ref_log_probs"]
    logps = compute_token_log_probs(policy_model, batch)
    labels_mask = labels_mask[..., 1:].to(logps.dtype)
    ref_logratio = ref_logps - logps
    kl_penalty = torch.exp(ref_logratio) - 1 - ref_logratio
    kl_penalty = kl_penalty * labels_mask
    loss = KL_COEFFICIENT * kl_penalty.sum() / total_response_len
    return loss
"""


def test_a_mask_rebound_to_its_shifted_self_is_fed_one_position_longer(tmp_path):
    """nano-aha-moment and its forks (four repositories of the thirty-eighth set) read the mask only as
    `labels_mask = labels_mask[..., 1:]`, the token positions after the first: the cut-out step is given a mask one
    position longer than the log-probs, as a causal LM's are. The rebinding counted as a whole read, so the mask came
    as long as the log-probs and the product failed on its size; the k3 loss is PFWD (row 3, KL002)."""
    pytest.importorskip("torch")
    from klaudit.audit.runner import run

    (tmp_path / "grpo.py").write_text(NANO_AHA_STEP)
    report = run([str(tmp_path / "grpo.py")])
    assert report.errors == [] and [(row.objective, row.rule) for row in report.results] == [("PFWD", "KL002")]


def test_a_mask_built_from_a_padding_id_in_instance_state_is_not_audited(tmp_path):
    """katiekang1998/SimpleGRPO: `mask = (output_ids != self.tokenizer.pad_token_id)`. The id had been read as a flag
    (True, so token 1 was masked) and the audit judged another objective; no id reproduces the response's mask on
    enumerated responses, so the slice says why it stops instead."""
    (tmp_path / "policy.py").write_text('''\\
import torch
import torch.nn.functional as F


class Policy:
    def get_loss(self, batch):
        output_ids = batch["output_ids"]
        logits = self.model(batch["input_output_ids"]).logits
        log_probs = torch.gather(F.log_softmax(logits, dim=-1), 2, output_ids.unsqueeze(-1)).squeeze(-1)
        mask = (output_ids != self.tokenizer.pad_token_id).int()
        log_probs = log_probs * mask
        log_ratio = batch["pretrained_log_probs"].sum(axis=1) - log_probs.sum(axis=1)
        kl_loss = torch.mean(torch.exp(log_ratio) - log_ratio - 1)
        loss = batch["pg_loss"] + self.kl_coeff * kl_loss
        loss.backward()
        self.optimizer.step()
''')
    slices, (failure,) = inline_slices(str(tmp_path / "policy.py"))
    assert slices == [] and "pad_token_id" in failure and "Policy.get_loss" in failure
