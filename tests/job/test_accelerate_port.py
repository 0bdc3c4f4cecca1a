"""`accelerate launch` ignores MASTER_PORT and takes --main_process_port (else 29500): podguard's port lease
reaches it (job/accelerate.py)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from jobproc import run_podguard, script
from podguard.job.accelerate import with_main_process_port

MINE = ["--config_file", "mine.yaml"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["accelerate", "launch", "train.py", "--lr", "1"],
            ["accelerate", "launch", "--main_process_port", "29612", "train.py", "--lr", "1"],
        ),
        (
            ["/v/bin/accelerate", "launch", "--num_processes", "2", "t.py"],
            ["/v/bin/accelerate", "launch", "--main_process_port", "29612", "--num_processes", "2", "t.py"],
        ),
        (
            ["python", "-m", "accelerate.commands.launch", "t.py"],
            ["python", "-m", "accelerate.commands.launch", "--main_process_port", "29612", "t.py"],
        ),
        (["accelerate", "launch", "--main_process_port", "1234", "t.py"], None),  # the user's own port stays
        (["accelerate", "launch", "--main_process_port=1234", "t.py"], None),
        (["accelerate", "launch", "--config_file", "c.yaml", "t.py"], None),  # its config may set the port
        (["accelerate", "launch", "--num_processes", "2", "--main_process_port", "1234", "t.py"], None),
        (["accelerate", "launch", "--num_processes", "2", "--config_file", "c.yaml", "t.py"], None),
        (
            ["accelerate", "launch", "--num_processes", "2", "t.py", *MINE],  # the script's own option
            ["accelerate", "launch", "--main_process_port", "29612", "--num_processes", "2", "t.py", *MINE],
        ),
        (["accelerate", "env"], None),
        (["python", "train.py", "--main_process_port"], None),
    ],
)
def test_the_port_goes_after_launch_unless_given(argv, expected):
    assert list(with_main_process_port(argv, 29612)) == (expected if expected is not None else argv)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("accelerate", path=str(Path(sys.executable).parent)) is None, reason="no accelerate")
def test_a_real_accelerate_launch_gets_the_leased_port(cli_node, tmp_path):
    job = script(tmp_path, "port.py", "import os\nprint('MASTER_PORT', os.environ.get('MASTER_PORT'), flush=True)\n")
    accelerate = str(Path(sys.executable).parent / "accelerate")
    cmd = [accelerate, "launch", "--cpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
    cmd += ["--dynamo_backend", "no", job]
    proc = run_podguard(cli_node, ["train", "--mode", "single", "--master-port", "29877", "--", *cmd], cpu=True)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "podguard: accelerate launch: --main_process_port 29877" in text
    assert "MASTER_PORT 29877" in text  # accelerate's own default would be 29500
    # `run` with the user's MASTER_PORT (no lease of podguard's): accelerate gets that one
    proc = run_podguard(cli_node, ["run", "--", *cmd], env={"MASTER_PORT": "29878"}, cpu=True)
    assert "MASTER_PORT 29878" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-3000:]
