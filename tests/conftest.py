"""How the suite's two workers share the modules (pytest_xdist_make_scheduler), and the fixtures several test modules
share: each costs real processes, so it runs once per test session (on each worker that needs it)."""
import contextlib
import functools
import io
import json
import os
import re

import pytest
from helpers import ROOT

from hetauto_megatron.cli import main

_RANKS_MARK = re.compile(r"^pytestmark\s*=.*\bpytest\.mark\.ranks\b", re.MULTILINE)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """How the two workers pytest.ini starts share the tests: a module at a time (its fixtures are built once), and
    the modules marked `ranks` (`pytestmark = pytest.mark.ranks`: they start several processes that each want a
    core) as one unit, so they run one after another on one worker, never two of them on the 2 cores at once. The
    test ids stay as they are (a failure's id can be run again, --lf works)."""
    from xdist.scheduler import LoadScopeScheduling

    @functools.cache            # (once per module, not per test)
    def scope(module: str) -> str:
        try:
            marked = _RANKS_MARK.search((config.rootpath / module).read_text())
        except OSError:
            marked = None
        return "ranks" if marked else module

    class ModulesAndRanks(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid.split("::", 1)[0])

    return ModulesAndRanks(config, log)


TINY_PLAN = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")


@pytest.fixture(scope="session")
def tiny_dryrun_files(tmp_path_factory):
    """One real --tiny dry run of the 2-cluster plan (6 ranks, 3 steps) with its single-process --reference: its
    --json output as printed, and the timelines it wrote with --compare: a trace (predicted, and measured on every
    rank) and a picture (predicted above measured)."""
    from helpers import CPU_INVENTORY
    d = tmp_path_factory.mktemp("tiny-dryrun")
    (d / "inv.yaml").write_text(CPU_INVENTORY)
    files = {"trace": d / "timeline.json", "picture": d / "timeline.png"}
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["dryrun", "--plan", TINY_PLAN, "--tiny", "--steps", "3", "--reference", "--json",
                   "--timeline", str(files["trace"]),
                   "--timeline", str(files["picture"]), "--compare", "--inventory", str(d / "inv.yaml")])
    assert rc == 0
    json.loads(buf.getvalue())
    return buf.getvalue(), files


@pytest.fixture(scope="session")
def readme_plan(tmp_path_factory):
    """The README's plan (LLaMA-2-70B on examples/llama/inventory-2clusters.yaml, global batch 512, overlapped
    cross-cluster boundaries), searched once: (plan file, inventory file). Tests only read it."""
    inv = os.path.join(ROOT, "examples", "llama", "inventory-2clusters.yaml")
    plan = str(tmp_path_factory.mktemp("readme-plan") / "plan.yaml")
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(["plan", "--model", "llama2-70b", "--inventory", inv, "--global-batch-size", "512", "-o", plan,
                   "--quiet", "--json", "--boundary-schedule", "overlapped"])
    assert rc == 0
    return plan, inv


@pytest.fixture(scope="session")
def tiny_dryrun_json(tiny_dryrun_files):
    """The --json output of one real --tiny dry run of the 2-cluster plan (6 ranks, 3 steps), as printed."""
    return tiny_dryrun_files[0]


@pytest.fixture(scope="session")
def tiny_cpu_model(tmp_path_factory):
    """(profile file, model directory): this CPU profiled on the tiny grid, fitted without a hold-out."""
    d = tmp_path_factory.mktemp("tiny-cpu-model")
    assert main(["profile", "--device-type", "cpu", "--grid", "tiny", "--out", str(d)]) == 0
    assert main(["fit", str(d / "profile-cpu.jsonl"), "-o", str(d / "model"), "--holdout", "0"]) == 0
    return d / "profile-cpu.jsonl", d / "model"


@pytest.fixture(scope="session")
def sailor_model_dir(tmp_path_factory) -> str:
    """A learned cost model fitted to Sailor's packaged measurements as `hetauto fit --sailor --holdout 0` fits it
    (~10 s). Tests only read it."""
    out = str(tmp_path_factory.mktemp("sailor-fit") / "model")
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["fit", "-o", out, "--holdout", "0", "--sailor"]) == 0
    return out
