"""`hetauto patch-megatron`: idempotent, verified, and refusing a file it does not fit.

No upstream code is shipped: the test writes a pretrain_gpt.py skeleton from the unpatched side of the
patch's own hunks (its context and removed lines), joined by the minimal glue that makes it valid Python
(the hunks sit in the import section, at the argument parsing of the main block, and inside the final
pretrain(...) call, as in Megatron-LM's file).
"""
import ast
import inspect
import pytest

from hetauto_megatron.cli import main as cli
from hetauto_megatron.commands import patch_megatron as pm
from hetauto_megatron.errors import InputError
from hetauto_megatron.megatron import hook

HUNKS = pm.parse_patch(open(pm.default_patch_path()).read())
GLUE = ["except ImportError:", "    pass", "", "# (upstream code)", "", 'if __name__ == "__main__":',
        "    full_config = None"]
CALL = ["    pretrain(", "        full_config,", "        train_valid_test_datasets_provider,",
        "        ModelType.encoder_or_decoder,"]


def skeleton() -> str:
    assert len(HUNKS) == 3, "the patch changes three places; update this skeleton when that changes"
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


def test_missing_file_or_directory_exits_2(tmp_path, capsys):
    assert cli(["patch-megatron", str(tmp_path)]) == 2
    assert "has no pretrain_gpt.py" in capsys.readouterr().err
    assert cli(["patch-megatron", str(tmp_path / "nope")]) == 2


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
    assert {c.func.attr for c in calls} == {"parse_and_validate_args", "pretrain_kwargs"}
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
