"""The --set link keys an error suggests are keys the command takes: each one, given back to `--set`, sets the
very link it was suggested for. Cluster names may hold '-', so joining a link's two names in sorted order can
spell another pair as well (clusters a-b, c, a, b-c: 'a-b-c' is a-b to c and a to b-c), and the suggestion was
then refused as reading two ways; where neither order reads one way only, the error says to edit the inventory."""
from __future__ import annotations

import re

import pytest
from helpers import run_cli

from hetauto_megatron.errors import InputError
from hetauto_megatron.spec.inventory import load_inventory
from hetauto_megatron.spec.whatif import apply_overrides


def _inventory(tmp_path, names, links):
    text = "clusters:\n" + "".join(f"  - {{name: {n}, device: cpu, nodes: 1, devices_per_node: 2}}\n" for n in names)
    text += "links:\n" + "".join(f"  - {{between: [{a}, {b}], bandwidth_gbps: 10, latency_ms: 0.1}}\n"
                                 for a, b in links)
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    return str(path)


def _suggested(err: str) -> list[str]:
    """The links an error's fix lists ('...: K1, K2' or 'write K1, K2', up to a ';'), each as the A-B of its key
    (whether written link.A-B.FIELD or A-B alone)."""
    fix = err.split("Fix:", 1)[1].split(";")[0].strip().rstrip(".")
    listed = re.split(r": |\bwrite ", fix)
    if len(listed) < 2:
        return []
    return [re.sub(r"^link\.|\.bandwidth_gbps$", "", k) for k in listed[-1].split(", ")]


def _set_link(inv, spelled: str) -> frozenset:
    """The one link `--set link.SPELLED.bandwidth_gbps=1` changes (all others keep their 10 Gbit/s)."""
    changed = apply_overrides(inv, [f"link.{spelled}.bandwidth_gbps=1"])
    moved = {pair for pair, link in changed.links.items() if link.bandwidth_gbps != inv.links[pair].bandwidth_gbps}
    assert len(moved) == 1, (spelled, moved)
    return next(iter(moved))


def _simulate(inv_file, key, capsys):
    return run_cli(["simulate", "--model", "tiny", "--inventory", inv_file, "--tp", "1", "--pp", "1", "--dp", "2",
                    "--micro-batch-size", "1", "--global-batch-size", "8", "--set", f"{key}=1"], capsys)


# clusters a-b, c, a, b-c (and d, linked to nothing): both links' sorted spelling is 'a-b-c'
NAMES = ("a-b", "c", "a", "b-c", "d")
LINKS = (("a-b", "c"), ("a", "b-c"))


@pytest.mark.parametrize("key", ["link.a-d.bandwidth_gbps", "link.a-b-c.bandwidth_gbps"])
def test_each_suggested_key_sets_its_link(tmp_path, capsys, key):
    """A missing link (a to d) lists the existing links; a key read two ways (a-b-c) lists the links it may mean.
    Before, the first listed 'a-b-c' twice (itself refused as two links) and the second suggested no key at all."""
    inv_file = _inventory(tmp_path, NAMES, LINKS)
    rc, _, err = _simulate(inv_file, key, capsys)
    assert rc == 2 and "Traceback" not in err and "field '--set'" in err, err
    keys = _suggested(err)
    inv = load_inventory(inv_file)
    assert sorted(map(sorted, map(lambda k: _set_link(inv, k), keys))) == sorted(map(sorted, LINKS)), err
    for spelled in keys:                   # and the command line takes each as it is written
        rc, _, err = _simulate(inv_file, f"link.{spelled}.bandwidth_gbps", capsys)
        assert rc == 0, err


def test_a_link_no_key_spells_alone_says_to_edit_the_inventory(tmp_path):
    """Clusters a, b-c, a-b, c, b, c-a: the a to b-c link reads 'a-b-c' (also a-b to c) or 'b-c-a' (also b to
    c-a); no --set key names it alone, so the error says so and points at the inventory file, and still suggests
    the link that has a key of its own."""
    names = ("a", "b-c", "a-b", "c", "b", "c-a", "d")
    inv = load_inventory(_inventory(tmp_path, names, (("a", "b-c"), ("b", "d"))))
    with pytest.raises(InputError) as caught:
        apply_overrides(inv, ["link.a-d.bandwidth_gbps=1"])
    err = caught.value.message
    assert "no key names the link between a and b-c" in err and "inventory file" in err, err
    assert [_set_link(inv, k) for k in _suggested(err)] == [frozenset(("b", "d"))], err
    for spelled in ("a-b-c", "b-c-a"):     # (the error's claim: both orders read two ways)
        with pytest.raises(InputError, match="reads as the link between"):
            apply_overrides(inv, [f"link.{spelled}.bandwidth_gbps=1"])


def test_explains_what_if_keys_read_back_as_their_link(tmp_path):
    """`explain`'s what-if rows give each link's --set key for scripts (--json "key"): it was the sorted join,
    'link.a-b-c.bandwidth_gbps' for both links here, which --set refuses as two links; now each sets its own link,
    and a link no key spells alone has none (null)."""
    from hetauto_megatron.plan.sensitivity import _link_key
    inv = load_inventory(_inventory(tmp_path, NAMES, LINKS))
    for pair in map(frozenset, LINKS):
        key = _link_key(inv, pair)
        assert _set_link(inv, re.sub(r"^link\.|\.bandwidth_gbps$", "", key)) == pair, key
    names = ("a", "b-c", "a-b", "c", "b", "c-a", "d")
    inv = load_inventory(_inventory(tmp_path, names, (("a", "b-c"), ("b", "d"))))
    assert _link_key(inv, frozenset(("a", "b-c"))) is None
