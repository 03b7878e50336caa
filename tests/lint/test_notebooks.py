"""Notebooks: code cells linted as one Python file, IPython's magics set aside, findings on the joined
code's lines with the cell and its line in the message; a broken notebook is one KL000."""

from __future__ import annotations

import json

from click.testing import CliRunner

from klaudit.cli import main
from klaudit.config import Settings
from klaudit.lint.engine import lint_paths
from klaudit.lint.notebooks import read_notebook

KL_CELL = ("import torch\n\n"
           "def kl_loss(logprobs, ref_logprobs, mask):\n"
           "    kl = logprobs - ref_logprobs\n"
           "    loss = (kl * mask).sum() / mask.sum()\n"
           "    return loss\n")


def notebook(*cells: tuple[str, str]) -> str:
    return json.dumps({"cells": [{"cell_type": kind, "metadata": {}, "source": text.splitlines(keepends=True),
                                  **({"outputs": [], "execution_count": None} if kind == "code" else {})}
                                 for kind, text in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def lint(tmp_path, text: str, name: str = "train.ipynb"):
    (tmp_path / name).write_text(text)
    return lint_paths([str(tmp_path)], settings=Settings(root=tmp_path), jobs=1)


def test_code_cells_are_joined_and_magics_set_aside():
    text = notebook(("markdown", "# title"), ("code", "%%capture\n!pip install trl\n"),
                    ("code", "x = 1\nfiles = !ls\nif x:\n    !echo hi\n%time y = 2"))
    book = read_notebook("n.ipynb", text.encode())
    assert book.code.splitlines() == ["pass", "", "x = 1", "pass", "if x:", "    pass", "pass"]
    assert book.shell.splitlines()[5] == "     echo hi"  # the command at its own column
    assert book.cell_of(1) == (2, 1) and book.cell_of(6) == (3, 4)
    assert book.text.splitlines()[3] == "files = !ls"


def test_a_cell_magic_after_blank_lines_takes_the_whole_cell():
    # HuichuanLI/play-with-instruct-model: IPython drops a cell's leading blank lines, so `%%chatglm` on the second
    # line is still a cell magic and the prompt under it is no Python (a false KL000 before)
    text = notebook(("code", "\n%%chatglm\n\n\u4f60\u662f\u8c01\uff1f"), ("code", "\n%%bash\necho hi\n"))
    book = read_notebook("n.ipynb", text.encode())
    assert book.code.splitlines() == ["", "pass", "", "", "", "pass", ""]
    assert book.shell.splitlines()[6] == "echo hi"


def test_a_cell_pasted_with_an_indent_runs_as_ipython_runs_it(tmp_path):
    # huggingface/cookbook: a cell whose first line starts with a space; IPython takes that indent off
    # every line that has it, so the cell runs, and its KL code is linted like any other
    text = notebook(("code", "\n co = make(\n    key=1\n)\nrest = 2"))
    assert read_notebook("n.ipynb", text.encode()).code.splitlines() == ["", "co = make(", "   key=1", ")", "rest = 2"]
    indented = "".join(f"  {line}\n" if line else "\n" for line in KL_CELL.splitlines())
    result = lint(tmp_path, notebook(("code", indented)))
    assert [(f.code, f.line) for f in result.findings] == [("KL001", 5)]  # k1 as a loss (row 1)


def test_magics_written_without_their_percent_sign_are_set_aside_where_they_are_not_python():
    text = notebook(("code", "cd ..\npip install -q trl\ntime = 3\nls -la\n  cd ~/data\nenv\n"))
    assert read_notebook("n.ipynb", text.encode()).code.splitlines() == [
        "pass", "pass", "time = 3", "ls -la", "  pass", "env"]


def test_a_help_request_is_set_aside():
    """bdsaglam/rlvr (fresh65): `ds.shuffle?` asks IPython for help, which runs in Jupyter; it was a false KL000."""
    text = notebook(("code", "ds.shuffle?\n  ??np.load\nnp.*load*?\nx = a if b else c\n"))
    assert read_notebook("n.ipynb", text.encode()).code.splitlines() == ["pass", "  pass", "pass", "x = a if b else c"]


def test_a_statement_that_starts_with_a_magic_s_name_is_python():
    """LMRL-Gym's notebook: `env = TextNavEnv(` opens a call over two lines, so the line alone does not
    compile; it starts an assignment, never the `env` magic (a false KL000 before)."""
    text = notebook(("code", "env = TextNavEnv(\n    display=False)\nrun(env)\ntime.sleep(1)\nenv\n"))
    assert read_notebook("n.ipynb", text.encode()).code.splitlines() == [
        "env = TextNavEnv(", "    display=False)", "run(env)", "time.sleep(1)", "env"]


def test_a_shell_line_goes_on_over_trailing_backslashes_and_is_linted_as_one_command(tmp_path):
    launch = ("!python3 -m verl.trainer.main_ppo \\\n algorithm.adv_estimator=grpo \\\n"
              " actor_rollout_ref.actor.use_kl_loss=True \\\n actor_rollout_ref.actor.kl_loss_type=low_var_kl\n"
              "x = 1\n")
    book = read_notebook("n.ipynb", notebook(("code", launch)).encode())
    assert book.code.splitlines() == ["pass", "", "", "", "x = 1"]
    assert book.shell.splitlines()[3] == " actor_rollout_ref.actor.kl_loss_type=low_var_kl"
    findings = lint(tmp_path, notebook(("code", launch))).findings
    # at the loss type (and KL008: verl's default batch sizes take four steps per rollout); no KL000 on the option lines
    assert [(f.line, f.code) for f in findings] == [(4, "KL002"), (4, "KL008")], findings


def test_python_rules_and_framework_flags_in_cells(tmp_path):
    text = notebook(("markdown", "# KL"), ("code", "!pip install trl"), ("code", KL_CELL),
                    ("code", "!python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=True"))
    result = lint(tmp_path, text)
    assert result.errors == []
    found = sorted((f.line, f.code, f.message.split(":", 1)[0]) for f in result.findings)
    assert found == [(6, "KL001", "cell 3, line 5"), (8, "KL002", "cell 4, line 1"), (8, "KL008", "cell 4, line 1")]
    output = CliRunner().invoke(main, ["lint", str(tmp_path), "--output-format", "json"]).output
    rows = sorted((item["location"]["row"], item["code"]) for item in json.loads(output))
    assert rows == [(6, "KL001"), (8, "KL002"), (8, "KL008")]  # the joined code's line: an integer a tool can use
    text_output = CliRunner().invoke(main, ["lint", str(tmp_path)]).output
    assert "    loss = (kl * mask).sum() / mask.sum()" in text_output  # the caret under the cell's own line


def test_noqa_works_in_cells_and_shell_lines(tmp_path):
    cell = KL_CELL.replace("mask.sum()\n", "mask.sum()  # noqa: KL001\n", 1)
    text = notebook(("code", cell), ("code", "!python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=True  # noqa: KL002, KL008"))
    assert lint(tmp_path, text).findings == []


def test_broken_notebooks_are_one_kl000(tmp_path):
    for name, text in (("bad_json.ipynb", "{not json"), ("not_a_notebook.ipynb", "[1, 2]"),
                       ("bad_code.ipynb", notebook(("code", "def f(:\n    pass")))):
        result = lint(tmp_path, text, name)
        found = [(f.code, f.path.endswith(name)) for f in result.findings if f.path.endswith(name)]
        assert found == [("KL000", True)], (name, result.findings)
        (tmp_path / name).unlink()
    assert "cell 1, line 1" in lint(tmp_path, notebook(("code", "def f(:\n    pass"))).findings[0].message


def test_a_bash_kernel_s_cells_are_shell_commands(tmp_path):
    text = json.loads(notebook(("code", "python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.use_kl_loss=True")))
    text["metadata"] = {"kernelspec": {"name": "bash", "language": "bash"}}
    assert [f.code for f in lint(tmp_path, json.dumps(text)).findings] == ["KL002", "KL008"]


def test_a_training_step_written_in_cells_without_functions_is_linted(tmp_path):
    """Most notebooks define no function: their top-level code is read as the module's own statements."""
    step = ("logp = policy(ids).log_softmax(-1)\nref_logp = ref_model(ids).log_softmax(-1)\n"
            "kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1\nloss = pg_loss + 0.1 * kl.mean()\nloss.backward()\n")
    result = lint(tmp_path, notebook(("code", "import torch\n"), ("markdown", "## step"), ("code", step)))
    found = [(f.line, f.code, f.message.split(":", 1)[0]) for f in result.findings]
    assert found == [(5, "KL002", "cell 3, line 4")]
