"""An import of a module of one name that no file beside the script holds is the installed package of that name.

zyhnosleep/qwen-project (seventy-sixth set): qwen_grpo.py and qwen_ppo.py import `from datasets import load_dataset`
(Hugging Face's), and the project holds a utils/datasets.py of its own without `load_dataset`. That file was taken
for the module the import reaches, so both scripts were read as failing at import and left unanalysed: their TRL
GRPOConfig (k3 as a loss, KL002) and legacy PPO with three epochs over each rollout (KL008) went unreported.
A dotted import (`from trainer.gen_worker import Worker`) may still be the project's module elsewhere.
"""

from __future__ import annotations

from klaudit.lint.unimportable import imports_a_missing_name

SCRIPT = "from {module} import {name}\n\nprint({name})\n"


def test_a_module_of_one_name_absent_beside_the_script_is_the_installed_package(tmp_path):
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "datasets.py").write_text("def format_rows(rows):\n    return rows\n")
    script = tmp_path / "train.py"
    sources = {str(tmp_path / "utils" / "datasets.py"): (tmp_path / "utils" / "datasets.py").read_text()}
    text = SCRIPT.format(module="datasets", name="load_dataset")
    assert not imports_a_missing_name(str(script), text, sources)


def test_a_dotted_module_of_the_project_that_lacks_the_name_still_fails(tmp_path):
    (tmp_path / "pkg" / "trainer").mkdir(parents=True)
    worker = tmp_path / "pkg" / "trainer" / "gen_worker.py"
    worker.write_text("class OtherWorker:\n    pass\n")
    text = SCRIPT.format(module="trainer.gen_worker", name="GenWorker")
    assert imports_a_missing_name(str(tmp_path / "run.py"), text, {str(worker): worker.read_text()})
