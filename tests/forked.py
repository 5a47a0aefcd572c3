"""Run many `tinygpt` commands as real processes, cheaply: import the CLI once, then fork one
child per command, whose stdout is a file or a pipe whose reader is already gone. The children
exit the way the console script does (SystemExit, then interpreter shutdown with its final
flush), so what a shell would see is what the test sees.

    python tests/forked.py CASES.json  ->  prints a JSON list of {code, out, err}
    CASES.json: [{"argv": [...], "stdout": "file" | "broken", "stdin": "text" | null}, ...]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

from tinygpt_cli.cli.app import _register  # the slow imports, once

_register()


def _warm_up() -> None:
    """Run a few commands here first, so their lazy imports are done once, not per child."""
    import contextlib
    import io

    from tinygpt_cli.cli import main

    for argv in (["review", "Lily wanted"], ["trace", "Lily", "--list"], ["info", "--json"],
                 ["generate", "Lily", "-n", "1", "--seed", "1"]):
        with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            main(argv)


def _child(case: dict, out_path: str, err_path: str) -> None:
    from tinygpt_cli.cli.entry import main

    if case.get("stdout") == "broken":
        r, w = os.pipe()
        os.close(r)  # the reader went away before the first byte
        os.dup2(w, 1)
    else:
        os.dup2(os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    fd = os.open(os.devnull, os.O_RDONLY)
    if case.get("stdin") is not None:
        rin, win = os.pipe()
        os.write(win, case["stdin"].encode())
        os.close(win)
        fd = rin
    os.dup2(fd, 0)
    main(case["argv"])  # raises SystemExit, which ends this child as it would end tinygpt


def run(cases: list[dict]) -> list[dict]:
    # No `with` or `finally` here: a child unwinds through this frame on its way out.
    tmp = tempfile.mkdtemp()
    results = []
    for i, case in enumerate(cases):
        out_path, err_path = os.path.join(tmp, f"{i}.out"), os.path.join(tmp, f"{i}.err")
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(case, out_path, err_path)
            os._exit(99)  # not reached: main always exits
        _, status = os.waitpid(pid, 0)
        result = {"code": os.waitstatus_to_exitcode(status)}
        for key, path in (("out", out_path), ("err", err_path)):
            with open(path, "rb") if os.path.exists(path) else open(os.devnull, "rb") as f:
                result[key] = f.read().decode("utf-8", "replace")
        results.append(result)
    shutil.rmtree(tmp)
    return results


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    _warm_up()
    json.dump(run(cases), sys.stdout)
