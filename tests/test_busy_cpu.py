"""`zoo generate|train|eval` on a CPU other jobs already hold: OpenMP threads sleep between operators
(OMP_WAIT_POLICY=PASSIVE), unless the user chose a policy or PyTorch is already loaded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import cli


@pytest.fixture
def before_torch(monkeypatch):
    """As at the command line's start: PyTorch not loaded yet."""
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(cli, "usable_cpus", lambda: 2)


@pytest.mark.parametrize("load, expected", [(0.2, None), (0.9, None), (1.0, "PASSIVE"), (4.5, "PASSIVE")])
def test_the_policy_follows_the_load(before_torch, monkeypatch, load, expected):
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    environ = {}
    assert cli.calm_openmp_on_a_busy_cpu(environ) == (expected is not None)
    assert environ.get("OMP_WAIT_POLICY") == expected


def test_a_policy_the_user_chose_is_kept(before_torch, monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (8.0, 8.0, 8.0))
    environ = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert not cli.calm_openmp_on_a_busy_cpu(environ)
    assert environ == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_nothing_is_set_once_torch_is_loaded(monkeypatch):
    import torch  # noqa: F401  (libgomp has read its environment: setting it now would only mislead)

    monkeypatch.setattr(os, "getloadavg", lambda: (8.0, 8.0, 8.0))
    environ = {}
    assert not cli.calm_openmp_on_a_busy_cpu(environ) and environ == {}


@pytest.mark.parametrize("args", [["train", "--help"], ["train", "no-such-store"]])
def test_the_command_line_sets_it_before_torch_loads(tmp_path, args):
    """A real process: the group callback runs before the command imports PyTorch, and says so in one line,
    except where the command only prints its help."""
    script = (
        "import os, sys; import cli; os.getloadavg = lambda: (64.0, 64.0, 64.0); "
        f"sys.argv = ['zoo', *{args!r}]; "
        "import click\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "print('POLICY', os.environ.get('OMP_WAIT_POLICY'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=120)
    assert "POLICY PASSIVE" in done.stdout, done.stdout + done.stderr
    assert ("the CPU is busy" in done.stderr) == ("--help" not in args), done.stderr
