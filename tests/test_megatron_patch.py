"""`hetauto patch-megatron`: idempotent, verified, and refusing a file it does not fit; and NVIDIA's own
pretrain_gpt.py, patched, running on CPU and answering user mistakes with exit 2 and one paragraph.

No upstream code is shipped: most tests write a pretrain_gpt.py skeleton from the unpatched side of the
patch's own hunks (its context and removed lines), joined by the minimal glue that makes it valid Python
(the hunks sit where the script first reads RANK, at the argument parsing of the main block, and inside the
final pretrain(...) call, as in Megatron-LM's file). The tests at the end run NVIDIA's real file (core_v0.19.0),
which scripts/setup.sh downloads into the cache or $HETAUTO_MEGATRON_LM points at; without it they skip.
"""
import ast
import inspect
import os
import shutil

import pytest
from helpers import NVIDIA_ENTRY_FILES, ROOT, nvidia_megatron_lm, run_script_forked

from hetauto_megatron.cli import main as cli
from hetauto_megatron.commands import patch_megatron as pm
from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import hook

HUNKS = pm.parse_patch(open(pm.default_patch_path()).read())
GLUE = ["", "# (upstream code)", "", 'if __name__ == "__main__":', "    full_config = None"]
CALL = ["    pretrain(", "        full_config,", "        train_valid_test_datasets_provider,",
        "        ModelType.encoder_or_decoder,"]


def skeleton() -> str:
    assert len(HUNKS) == 3, "the patch changes three places (hunks); update this skeleton when that changes"
    lines = list(HUNKS[0].old) + GLUE + list(HUNKS[1].old) + CALL + list(HUNKS[2].old)
    return "\n".join(lines) + "\n"


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "pretrain_gpt.py").write_text(skeleton())
    compile(skeleton(), "skeleton", "exec")  # the test's own file must be valid Python
    return tmp_path


def read(tree):
    return (tree / "pretrain_gpt.py").read_text()


def test_apply_twice_leaves_one_copy(tree, capsys):
    assert cli(["patch-megatron", str(tree)]) == 0
    first = read(tree)
    out = capsys.readouterr().out
    assert "patched" in out and "+ **hetauto.pretrain_kwargs(args)," in out
    assert first.count("from hetauto_megatron.megatron import hook as hetauto") == 1
    assert first.count("**hetauto.pretrain_kwargs(args)") == 1
    assert "args = hetauto.parse_and_validate_args(" in first and "args = parse_and_validate_args(" not in first
    compile(first, "patched", "exec")
    assert cli(["patch-megatron", str(tree)]) == 0
    assert read(tree) == first
    assert "already patched" in capsys.readouterr().out


def test_check_mode_changes_nothing(tree, capsys):
    before = read(tree)
    assert cli(["patch-megatron", str(tree), "--check"]) == 0
    assert read(tree) == before and "not patched yet" in capsys.readouterr().out


def test_a_file_the_patch_does_not_fit_exits_2_and_stays_unchanged(tree, capsys):
    text = read(tree).replace("args = parse_and_validate_args(", "args = my_own_parser(")
    (tree / "pretrain_gpt.py").write_text(text)
    assert cli(["patch-megatron", str(tree)]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "hunk 2" in err and "parse_and_validate_args" in err and "Fix:" in err
    assert read(tree) == text


def test_a_partly_patched_file_is_a_conflict(tree, capsys):
    lines = read(tree).split("\n")
    patched_first = pm.apply_hunks(lines, HUNKS[:1], (pm._find(lines, HUNKS[0].old)[0],))
    (tree / "pretrain_gpt.py").write_text("\n".join(patched_first))
    assert cli(["patch-megatron", str(tree)]) == 2
    assert "some hunks are applied" in capsys.readouterr().err


def test_a_file_patched_by_an_earlier_version_is_named_so(tree, capsys):
    """A file patched by the four-line patch (before the line that ends the process after training) is refused
    with what it is and how to patch it again; it said only that the patch did not fit near line 527."""
    assert cli(["patch-megatron", str(tree)]) == 0
    added = HUNKS[2].added[-1]
    earlier = read(tree).replace(added + "\n", "")
    assert added.strip() == "hetauto.exit_after_training()  # --hetauto: the process ends here, its process groups " \
        "destroyed first" and added not in earlier
    (tree / "pretrain_gpt.py").write_text(earlier)
    capsys.readouterr()
    assert cli(["patch-megatron", str(tree)]) == 2
    err = capsys.readouterr().err
    assert "holds an earlier version (or a part) of the hetauto patch" in err, err
    assert "git checkout pretrain_gpt.py" in err, err
    assert read(tree) == earlier


def test_moved_context_is_patched_with_fuzz_and_stays_idempotent(tree, capsys):
    """Later Megatron-LM commits change lines next to the patch's changes: an import above the added ones
    becomes a multi-line import, and pretrain(...) gains an argument above the last two. As GNU patch (fuzz
    2) the patch still goes in at the same places, says so, and a second run sees it applied; a changed line
    (the one the patch replaces) is never fuzzed: test_a_file_the_patch_does_not_fit_exits_2..."""
    imports, call = HUNKS[0].old, HUNKS[2].old
    text = read(tree)
    text = text.replace(imports[0] + "\n", "from megatron.training.training import (\n    something_else,\n)\n", 1)
    text = text.replace(call[0] + "\n", call[0] + "\n        model_provider=partial(model_provider, builder),\n", 1)
    (tree / "pretrain_gpt.py").write_text(text)
    assert cli(["patch-megatron", str(tree), "--check"]) == 0
    assert "the patch fits" in capsys.readouterr().out and read(tree) == text
    assert cli(["patch-megatron", str(tree)]) == 0
    out = capsys.readouterr().out
    assert "hunk 1" in out and "hunk 3" in out and "hunk 2" not in out and "context" in out
    patched = read(tree)
    compile(patched, "patched", "exec")
    lines = patched.split("\n")
    added = [line for h in HUNKS for line in h.added]
    assert all(lines.count(line) == 1 for line in added)
    # each added line lands where core_r0.19.0's file has it: after the same neighbour line
    assert lines[lines.index(HUNKS[0].added[-1]) + 1] == "rank = int(os.environ.get('RANK', 0))"
    assert lines[lines.index(HUNKS[2].added[0]) - 1].strip() == "get_embedding_ranks=get_embedding_ranks,"
    assert lines[lines.index(HUNKS[2].added[0]) + 1].strip() == ")"
    assert cli(["patch-megatron", str(tree)]) == 0 and read(tree) == patched
    assert "already patched" in capsys.readouterr().out


def test_fuzz_never_anchors_on_too_little(tree, capsys):
    """With the context beside an addition gone, or ambiguous, nothing is changed."""
    neighbour = "rank = int(os.environ.get('RANK', 0))"
    text = read(tree).replace(neighbour + "\n", "")
    (tree / "pretrain_gpt.py").write_text(text)
    assert cli(["patch-megatron", str(tree)]) == 2
    assert "hunk 1" in capsys.readouterr().err and read(tree) == text


def test_missing_file_or_directory_exits_2(tmp_path, capsys):
    assert cli(["patch-megatron", str(tmp_path)]) == 2
    assert "has no pretrain_gpt.py" in capsys.readouterr().err
    assert cli(["patch-megatron", str(tmp_path / "nope")]) == 2


def test_binary_script_or_patch_exits_2(tree, tmp_path, capsys):
    """A binary pretrain_gpt.py or --patch file was a UnicodeDecodeError traceback."""
    garbage = bytes(range(128, 256)) * 3
    (tmp_path / "bin.patch").write_bytes(garbage)
    assert cli(["patch-megatron", str(tree), "--patch", str(tmp_path / "bin.patch")]) == 2
    err = capsys.readouterr().err
    assert "bin.patch: is not a UTF-8 text file" in err and "Traceback" not in err and "Fix:" in err
    (tree / "pretrain_gpt.py").write_bytes(garbage)
    assert cli(["patch-megatron", str(tree)]) == 2
    err = capsys.readouterr().err
    assert "pretrain_gpt.py: is not a UTF-8 text file" in err and "Traceback" not in err and "Fix:" in err
    assert (tree / "pretrain_gpt.py").read_bytes() == garbage


def test_windows_line_endings_are_kept(tree):
    (tree / "pretrain_gpt.py").write_bytes(skeleton().replace("\n", "\r\n").encode())
    pm.patch_megatron(str(tree), out=lambda *_: None)
    data = (tree / "pretrain_gpt.py").read_bytes()
    assert b"pretrain_kwargs" in data and data.count(b"\r\n") == data.count(b"\n")


def test_patch_calls_only_the_hooks_public_api():
    """The added lines call hook functions that exist, with keywords they accept."""
    lines = skeleton().split("\n")
    patched = "\n".join(pm.apply_hunks(lines, HUNKS, tuple(pm._find(lines, h.old)[0] for h in HUNKS)))
    exec("from hetauto_megatron.megatron import hook as hetauto", {})  # the added import works
    calls = [node for node in ast.walk(ast.parse(patched))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and isinstance(node.func.value, ast.Name) and node.func.value.id == "hetauto"]
    assert {c.func.attr for c in calls} == {"guard_script_errors", "parse_and_validate_args", "pretrain_kwargs",
                                              "exit_after_training"}
    for call in calls:
        params = inspect.signature(getattr(hook, call.func.attr)).parameters
        for kw in call.keywords:
            assert kw.arg in params, (call.func.attr, kw.arg)


def test_malformed_patch_is_an_input_error():
    with pytest.raises(InputError):
        pm.parse_patch("no hunks here")


def test_the_patch_is_package_data_and_patches_dir_links_to_it():
    """One copy: the installed package carries it (no source checkout needed); patches/ points at it."""
    import os

    import hetauto_megatron

    pkg = os.path.dirname(os.path.abspath(hetauto_megatron.__file__))
    assert os.path.dirname(pm.default_patch_path()) == os.path.join(pkg, "data", "patches")
    repo_copy = os.path.join(os.path.dirname(pkg), "patches", "pretrain_gpt.patch")
    assert os.path.samefile(repo_copy, pm.default_patch_path())


# ---- NVIDIA's pretrain_gpt.py, patched ------------------------------------------------------------------
PLAN = os.path.join(ROOT, "examples", "llama", "plans", "tiny-2clusters-cpu.yaml")   # 6 ranks, 2 clusters


@pytest.fixture(scope="module")
def nvidia_script(tmp_path_factory):
    source = nvidia_megatron_lm()
    if source is None:
        pytest.skip("NVIDIA's pretrain_gpt.py (core_v0.19.0) is not available: scripts/setup.sh downloads it, or "
                    "set HETAUTO_MEGATRON_LM to a Megatron-LM checkout of branch core_r0.19.0")
    tree = tmp_path_factory.mktemp("megatron-lm")
    for name in NVIDIA_ENTRY_FILES:
        shutil.copy(os.path.join(source, name), tree / name)
    assert pm.patch_megatron(str(tree), out=lambda *_: None) == "patched"
    return str(tree / "pretrain_gpt.py")


def _run_script(script, argv, world_size, cwd):
    """Rank 0 of a torchrun launch of `world_size` processes: the environment torchrun gives a worker (the
    script's own code in a child forked from this process: helpers.run_script_forked)."""
    from hetauto_megatron.runtime.launcher import free_port

    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), CUDA_DEVICE_MAX_CONNECTIONS="1")
    return run_script_forked(script, argv, env, str(cwd))


def _hetauto_argv():
    from hetauto_megatron.megatron import demo
    from hetauto_megatron.plan.plan import load_plan

    return demo.hetauto_argv(PLAN, load_plan(PLAN), iters=1, seed=1)


# name: (world size, arguments added after the plan's own (the last occurrence wins), words of the paragraph);
# NVIDIA's script, and the example entry script (examples/llama/pretrain_llama_hetauto.py) once
MISTAKES = {
    "wrong world size": (2, [], ["launched with 2 processes but the plan needs 6", PLAN, "Fix:"]),
    "wrong world size, the example entry script": (2, [], ["launched with 2 processes but the plan needs 6"]),
    "missing plan": (6, ["--hetauto-plan", "no-such-plan.yaml"], ["no-such-plan.yaml: plan file not found"]),
    "model mismatch": (6, ["--num-layers", "12"], ["another model than the plan's", "--num-layers 12 (plan: 8)"]),
    "flag the plan does not run": (6, ["--fp16"], ["--fp16 (plan: precision is fp32", "field 'precision'",
                                                    "Fix:"]),
    "unknown cluster": (6, ["--hetauto-cluster", "cluster-z"],
                        ["the plan has no cluster 'cluster-z' (its clusters: cluster-a, cluster-b)", "Fix:"]),
    # Megatron-LM's own assertion in validate_args (before: its traceback)
    "megatron's own argument check": (6, ["--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "10"],
                                      ["Megatron-LM's own check of the arguments (validate_args) refused this launch: "
                                       "can only specify one of lr-warmup-fraction and lr-warmup-iters", "Fix:"]),
    # a RuntimeError of Megatron-LM's validate_args (a flag that needs a package this machine lacks; before: its
    # traceback on every rank)
    "megatron's own error": (6, ["--non-persistent-ckpt-type", "local"],
                             ["refused this launch: nvidia_resiliency_ext is required for local checkpointing",
                              "Fix:"]),
    # a bare assertion of Megatron-LM's: its line is what names the flags
    "megatron's bare assertion": (6, ["--min-lr", "1e-2"], ["refused this launch: `assert args.min_lr <= args.lr` "
                                                           "(megatron/training/arguments.py, line", "Fix:"]),
    # Megatron-Core's TransformerConfig refuses what validate_args let through (here: no Transformer Engine 2.3),
    # now right after validate_args (before: its traceback in pretrain(), after the join, on every rank)
    "megatron-core's config": (6, ["--symmetric-ar-type", "two_shot"],
                               ["TransformerConfig (core_transformer_config_from_args) refused this launch: Must "
                                "have at least TE version 2.3", "field '--symmetric-ar-type'",
                                "remove --symmetric-ar-type"]),
    # Megatron's assertion on the tokenizer's arguments, raised where it builds the tokenizer
    "a tokenizer without its files": (6, ["--tokenizer-type", "HuggingFaceTokenizer"],
                                      ["Megatron-LM could not build the tokenizer (--tokenizer-type "
                                       "HuggingFaceTokenizer): Tokenizer path must be specified", "Fix:"]),
}


def test_nvidia_script_answers_user_mistakes_with_one_paragraph_and_exit_2(nvidia_script, tmp_path):
    from hetauto_megatron.megatron import demo
    argv = _hetauto_argv()

    def run(name):
        world, extra, _ = MISTAKES[name]
        script = demo.ENTRY_SCRIPT if "entry script" in name else nvidia_script
        return _run_script(script, argv + extra, world, tmp_path)
    runs = {name: run(name) for name in MISTAKES}
    for name, proc in runs.items():
        err = proc.stderr
        assert proc.returncode == 2, (name, err[-3000:])
        assert "Traceback" not in err, (name, err[-3000:])
        paragraph = [line for line in err.splitlines() if line.startswith("hetauto: error:")]
        assert len(paragraph) == 1, (name, err[-3000:])
        for words in MISTAKES[name][2]:
            assert words in paragraph[0], (name, words, paragraph[0])


def _one_rank_without_mock_data(nvidia_script, tmp_path, extra: list):
    """NVIDIA's script under --hetauto on a one-rank plan of the tiny model, reading the data `extra` names instead
    of --mock-data: (its exit code, the lines of its paragraph, stderr)."""
    import yaml

    from hetauto_megatron.megatron import demo
    from hetauto_megatron.plan.plan import load_plan
    from hetauto_megatron.runtime.launcher import free_port

    raw = yaml.safe_load(open(PLAN))
    raw.update(global_batch_size=4, meshes=[{"cluster": "cluster-a", "device_type": "cpu", "tp": 1, "dp": 1,
                                              "micro_batch_size": 2, "recompute": "none", "stage_layers": [8]}])
    plan_file = tmp_path / "one-rank.yaml"
    plan_file.write_text(yaml.safe_dump(raw))
    argv = demo.hetauto_argv(str(plan_file), load_plan(str(plan_file)), iters=1, seed=1)
    argv.remove("--mock-data")
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), CUDA_DEVICE_MAX_CONNECTIONS="1")
    proc = run_script_forked(nvidia_script, argv + extra, env, str(tmp_path))
    err = proc.stderr
    assert "Traceback" not in err, err[-3000:]
    return proc.returncode, [line for line in err.splitlines() if line.startswith("hetauto: error:")], err


def test_a_data_prefix_this_machine_lacks_is_one_paragraph_where_megatron_reads_it(nvidia_script, tmp_path):
    """A --data-path prefix without its .bin and .idx on the machine of a rank that reads data: Megatron-LM built
    the model and the optimizer, then stopped in IndexedDataset with an AssertionError traceback. Only some ranks
    read data (each pipeline's first and last stage, TP rank 0), so it is said where Megatron reads it: one
    paragraph naming the flag, Megatron's words and the machine, exit 2."""
    import socket

    prefix = str(tmp_path / "corpus_text_document")
    code, paragraph, err = _one_rank_without_mock_data(nvidia_script, tmp_path, ["--data-path", "1.0", prefix])
    assert code == 2 and len(paragraph) == 1, err[-3000:]
    assert paragraph[0].startswith(f"hetauto: error: field '--data-path': Megatron-LM could not build the training "
                                   f"data on this machine ({socket.gethostname()})"), paragraph[0]
    assert f"cannot be found at the path prefix {prefix}" in paragraph[0] and "PREFIX.idx" in paragraph[0]


def test_a_per_split_file_megatron_cannot_read_is_one_paragraph(nvidia_script, tmp_path):
    """--per-split-data-args-path naming a file that is not JSON: Megatron-LM's json.load stopped the rank with a
    JSONDecodeError traceback once the model was built; one paragraph naming the file, the flag, the parser's
    words and the keys to write, exit 2. The file's other shapes Megatron could not index (a list; a key missing:
    KeyError, TypeError tracebacks) are said the same way (the check itself, in this process)."""
    from hetauto_megatron.megatron.training_inputs import _check_per_split_file

    bad = tmp_path / "splits.json"
    bad.write_text('{"train": ["1.0", "/data/a"],')
    code, paragraph, err = _one_rank_without_mock_data(nvidia_script, tmp_path,
                                                       ["--per-split-data-args-path", str(bad)])
    assert code == 2 and len(paragraph) == 1, err[-3000:]
    assert paragraph[0].startswith(f"hetauto: error: {bad}: field '--per-split-data-args-path': "), paragraph[0]
    assert "it is not JSON (Expecting property name" in paragraph[0] and '"train", "valid" and "test"' in paragraph[0]
    for text, words in (('["/data/a"]', "a JSON list, not an object"), ('{"train": "/data/a", "valid": "/data/a"}',
                                                                         "no key 'test'"),
                        ('{"train": {"a": 1}, "valid": null, "test": "/data/a"}', "'train' is not a string or a list")):
        bad.write_text(text)
        with pytest.raises(InputError, match=words):
            _check_per_split_file(str(bad))
    bad.write_text('{"train": ["30", "/data/a", "70", "/data/b"], "valid": "/data/c", "test": null}')
    _check_per_split_file(str(bad))                   # Megatron's own reading of it, left to Megatron


def test_a_dataset_index_cache_this_machine_cannot_write_is_one_paragraph(nvidia_script, tmp_path):
    """--data-cache-path under a file: Megatron-Core's rank 0 could not write the dataset indices it draws and
    stopped with "Exception: ... Failed to write dataset materials to the data cache directory" (a traceback, once
    the model was built); one paragraph naming --data-cache-path and the OSError, exit 2."""
    (tmp_path / "notes.txt").write_text("x")
    code, paragraph, err = _one_rank_without_mock_data(
        nvidia_script, tmp_path, ["--mock-data", "--data-cache-path", str(tmp_path / "notes.txt" / "cache")])
    assert code == 2 and len(paragraph) == 1, err[-3000:]
    assert paragraph[0].startswith("hetauto: error: field '--data-cache-path': Megatron-LM could not write the dataset "
                                   "indices it draws to its cache directory"), paragraph[0]
    assert "Not a directory" in paragraph[0] and str(tmp_path / "notes.txt") in paragraph[0], paragraph[0]


@pytest.mark.parametrize("variables", [{"RANK": "abc", "WORLD_SIZE": "6"}, {"RANK": "0", "WORLD_SIZE": "six"},
                                       {"RANK": "0", "WORLD_SIZE": "6", "LOCAL_RANK": "first"}])
def test_nvidia_script_answers_launch_variables_that_are_not_numbers(nvidia_script, tmp_path, variables):
    """NVIDIA's script started by hand (no torchrun) with a RANK or WORLD_SIZE that is not a number: its own 16th
    line (int(RANK)) and Megatron's parser (int(WORLD_SIZE), from pretrain_gpt.py:511) stopped it with a ValueError
    traceback before the hook ran. The patch's guard, right after its import and before that line, says it in one
    paragraph naming the variable, exit 2."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", CUDA_DEVICE_MAX_CONNECTIONS="1", **variables)
    proc = run_script_forked(nvidia_script, _hetauto_argv(), env, str(tmp_path))
    name = next(k for k, v in variables.items() if not v.isdigit())
    err = proc.stderr
    assert proc.returncode == 2 and "Traceback" not in err, err[-3000:]
    paragraph = [line for line in err.splitlines() if line.startswith("hetauto: error:")]
    assert paragraph == [f"hetauto: error: field '{name}': environment variable {name}={variables[name]!r} is not an "
                         f"integer. Fix: let torchrun set {name} (the launch scripts of 'hetauto emit megatron' start "
                         f"it), or, starting one process by hand, give {name} a whole number (e.g. RANK=0 LOCAL_RANK=0 "
                         f"WORLD_SIZE=1) or unset it."], err[-3000:]


def test_a_refusal_after_the_process_group_exists_still_prints_its_paragraph():
    """NVIDIA's script, once torch.distributed is initialised: torch's excepthook (installed by init_process_group)
    points sys.stderr at a buffer, calls the previous hook, and prints the buffer only when it returns; hetauto's
    hook exits there. Every rank of a launch whose plans differed stopped with exit 2 and no paragraph."""
    import subprocess
    import sys

    from hetauto_megatron.runtime.launcher import free_port
    code = ("import torch.distributed as dist; from hetauto_megatron.megatron import hook; "
            "from hetauto_megatron.errors import InputError; hook.guard_script_errors(); "
            f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{free_port()}', rank=0, world_size=1); "
            # the join's process holds gloo's group: it ends as a --hetauto rank's (hook.pretrain_kwargs takes charge
            # before the join), not through interpreter finalisation, where a gloo thread can abort it (pytorch#190489)
            "hook._take_charge_of_exit(60.0); "
            "raise InputError('the ranks were started with different plans', field='--hetauto-plan', "
            "fix='start every rank with the same plan file')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "hetauto: error: field '--hetauto-plan': the ranks were started with different plans" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_path_that_is_not_a_checkout_says_what_it_is(tmp_path, capsys):
    """An empty path, a missing one and a file were all "is not a directory" (the empty one naming no path)."""
    (tmp_path / "notes.txt").write_text("x")
    for path, words in (("", "the Megatron-LM path is empty"), (str(tmp_path / "nope"), "does not exist"),
                        (str(tmp_path / "notes.txt"), "is a file, not a directory")):
        assert cli(["patch-megatron", path]) == 2
        err = capsys.readouterr().err
        assert words in err and "Fix:" in err and "Traceback" not in err, err


def test_a_failed_write_leaves_the_file_whole(tree, monkeypatch, capsys):
    """The patched text is written to a temporary file and renamed over the original: a write that fails (a full
    disk here) left pretrain_gpt.py empty, as 'open(target, "w")' truncates it first."""
    import builtins
    before = read(tree)
    real_open = builtins.open

    def full_disk(path, mode="r", *a, **kw):
        fh = real_open(path, mode, *a, **kw)
        if "w" in mode and str(path).endswith((".py", ".hetauto-tmp")):
            def write(_):
                raise OSError(28, "No space left on device")
            fh.write = write
        return fh
    monkeypatch.setattr(builtins, "open", full_disk)
    assert cli(["patch-megatron", str(tree)]) == 2
    monkeypatch.undo()
    assert read(tree) == before and not list(tree.glob("*.hetauto-tmp"))
    assert "No space left" in capsys.readouterr().err
