"""Set-up files stay in step, and the runtime switch behaves as documented."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def normalize(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["dev"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert sorted(map(normalize, pip_section)) == sorted(map(normalize, declared))
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    assert normalize(python) == "python" + project["requires-python"]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make lab" in readme
    assert re.search(r"^time make test$", (ROOT / ".ci/run").read_text(), re.M)


def test_torch_is_never_pinned_from_above():
    # An installed torch (CPU or CUDA build) must satisfy the requirement as it is.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (torch_req,) = [r for r in project["dependencies"] if r.startswith("torch")]
    assert "<" not in torch_req and "==" not in torch_req
    assert "--system-site-packages" in (ROOT / "Makefile").read_text()


def run_python(code: str, **env) -> str:
    full_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env
    return subprocess.run([sys.executable, "-c", code], env=full_env, cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_runtime_decision():
    import torch
    out = run_python("import mta, os; print(mta.runtime.INTERPRET, os.environ.get('TRITON_INTERPRET'), mta.runtime.DEVICE)")
    expected = "False None cuda" if torch.cuda.is_available() else "True 1 cpu"
    assert out == expected


def test_user_setting_wins():
    out = run_python("import mta; print(mta.runtime.INTERPRET, mta.runtime.DEVICE, len(mta.runtime.SAFE_DTYPES))",
                     TRITON_INTERPRET="1")
    assert out == "True cpu 2"


def test_the_users_setting_is_read_as_triton_reads_it():
    """``true``/``on``/``yes`` switch Triton's interpreter on, so they do for ``mta`` too; off without a GPU,
    ``describe()`` says the kernels cannot run instead of raising."""
    import torch
    code = "import mta; r = mta.runtime; print(r.INTERPRET, r.DEVICE, len(r.SAFE_DTYPES), '|', r.describe())"
    for value in ("true", "ON", "yes"):
        assert run_python(code, TRITON_INTERPRET=value).startswith("True cpu 2 | Triton interpreter")
    if not torch.cuda.is_available():
        assert run_python(code, TRITON_INTERPRET="0") == (
            "False cpu 2 | no CUDA device and TRITON_INTERPRET is off: the Triton kernels cannot run here "
            "(unset TRITON_INTERPRET, or set it to 1)")


def test_the_interpreter_builds_no_overflow_checks_it_would_drop():
    """Under the interpreter, ``import mta`` turns off the int32 overflow checks that Triton's interpreter builds
    for integer arithmetic and then drops (it keeps asserts only in debug mode); asked again, nothing is left to do."""
    code = ("import mta; from triton.runtime import interpreter as i; "
            "print(i.interpreter_builder.options.sanitize_overflow, i.interpreter_builder.options.debug, "
            "mta.runtime.skip_dropped_overflow_checks())")
    assert run_python(code, TRITON_INTERPRET="1") == "False False False"
