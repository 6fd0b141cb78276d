"""dev/mutate.py's test selection: a mutant's run must run every covering test the traced
baseline recorded, however often pytest has run in the same worker process before."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Runs in a child process: the runner calls pytest.main itself, once per session, as its
# worker does (baseline by file, then mutant runs by test id).
DRIVER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1] + "/dev")
    import mutate
    root = Path(sys.argv[2])
    mutate.ROOT = root
    runs = []
    rec = mutate._Recorder(None)
    runs.append((mutate._pytest(["test_ids.py"], rec, root / "t0"), rec.outcomes))
    ids = sorted(rec.outcomes)
    for k in range(3):
        rec = mutate._Recorder(None)
        runs.append((mutate._pytest(ids, rec, root / f"t{k + 1}"), rec.outcomes))
    rec = mutate._Recorder(None)
    rc = mutate._pytest(ids + ["test_ids.py::test_cmd[no such id]"], rec, root / "t9")
    runs.append((rc, {"failed": rec.failed}))
    print(json.dumps(runs))
""")

TESTS = textwrap.dedent(r'''
    import pytest

    CASES = ["find . -exec rm {} \\;", "plain", "tab\there", "naïve"]

    @pytest.mark.parametrize("cmd", CASES, ids=CASES)
    def test_cmd(cmd):
        assert cmd
''')


def test_escaped_ids_are_selected_in_every_later_session(tmp_path: Path) -> None:
    (tmp_path / "test_ids.py").write_text(TESTS, encoding="utf-8")
    out = subprocess.run([sys.executable, "-c", DRIVER, str(ROOT), str(tmp_path)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    runs = json.loads(out.stdout.strip().splitlines()[-1])
    rc, first = runs[0]
    assert rc == 0 and len(first) == 4 and set(first.values()) == {"passed"}
    # Before the runner imported test modules afresh, the ids holding a backslash, a tab or a
    # non-ASCII letter were escaped once more each session and silently deselected.
    for rc, outcomes in runs[1:4]:
        assert rc == 0
        assert outcomes == first
    # An id that is not collected is an error of the run, not a quiet pass of the others.
    rc, info = runs[4]
    assert rc == 3
    assert info["failed"].startswith("not collected: test_ids.py::test_cmd[no such id]")
