"""probe-link between two local processes: a bandwidth and a latency, printed as a parseable inventory link."""
import json

import pytest
import yaml

from hetauto_megatron.cli import main
from hetauto_megatron.spec.inventory import inventory_from_dict

pytestmark = pytest.mark.ranks     # starts several rank processes: one such module at a time (conftest)


def test_probe_link_local_reports_bandwidth_and_latency_as_inventory_link(capsys):
    """Called from Python (as here), the command returns and leaves the caller's process as it was: not in charge
    of its exit (a later main_guard in the caller's script would have ended the caller's process)."""
    from hetauto_megatron.runtime.clean_exit import in_charge_of_exit
    assert main(["probe-link", "--local", "--max-size-mib", "1", "--iters", "2", "--timeout", "60",
                 "--between", "east", "west"]) == 0
    assert not in_charge_of_exit()
    out = capsys.readouterr().out
    link = yaml.safe_load(out)["links"]
    assert len(link) == 1 and link[0]["bandwidth_gbps"] > 0 and link[0]["latency_ms"] > 0
    inv = inventory_from_dict({"clusters": [
        {"name": "east", "device": "cpu", "nodes": 1, "devices_per_node": 1},
        {"name": "west", "device": "cpu", "nodes": 1, "devices_per_node": 1}], "links": link})
    spec = inv.link("east", "west")
    assert spec.bandwidth_gbps == link[0]["bandwidth_gbps"] and spec.latency_s > 0


def test_probe_link_connections_give_the_total_and_one_connections_rate(capsys):
    """--connections 2: the largest messages also go on two gloo connections at once; the entry gives their total
    as bandwidth_gbps and one connection's measured rate as flow_gbps, and the inventory reads both."""
    assert main(["probe-link", "--local", "--max-size-mib", "1", "--iters", "2", "--timeout", "60",
                 "--connections", "2", "--between", "east", "west"]) == 0
    link = yaml.safe_load(capsys.readouterr().out)["links"]
    assert 0 < link[0]["flow_gbps"] <= link[0]["bandwidth_gbps"]
    inv = inventory_from_dict({"clusters": [
        {"name": "east", "device": "cpu", "nodes": 1, "devices_per_node": 1},
        {"name": "west", "device": "cpu", "nodes": 1, "devices_per_node": 1}], "links": link})
    assert inv.link("east", "west").flow_gbps == link[0]["flow_gbps"]
    assert main(["probe-link", "--local", "--connections", "0"]) == 2
    capsys.readouterr()
    # --json gives the N connections' own rate too, as the text does (it was left out)
    assert main(["probe-link", "--local", "--max-size-mib", "1", "--iters", "2", "--timeout", "60",
                 "--connections", "2", "--json"]) == 0
    captured = capsys.readouterr()
    res = json.loads(captured.out)
    assert res["connections"] == 2 and 0 < res["together_gbps"] <= res["link"]["bandwidth_gbps"]
    assert "hetauto probe-link: 2 connections at once, size 1/" in captured.err     # its progress too


def test_probe_link_json_has_per_size_rates_and_progress_on_stderr(capsys):
    """The probe (half a minute by default) printed nothing until its result: each step is now a line on stderr,
    and stdout stays the JSON alone."""
    assert main(["probe-link", "--local", "--max-size-mib", "0.25", "--iters", "1", "--json"]) == 0
    captured = capsys.readouterr()
    res = json.loads(captured.out)
    assert [r["bytes"] for r in res["per_size"]] == [1024, 4096, 16384, 65536, 262144]
    assert res["latency_us"] > 0 and res["link"]["bandwidth_gbps"] > 0
    # (its own lines: a library's warning on stderr, a loaded machine's, is no progress line)
    lines = [line for line in captured.err.splitlines() if line.startswith("hetauto probe-link: ")]
    assert lines[0].startswith("hetauto probe-link: waiting for rank 1 at 127.0.0.1:")
    # (the JSON rounds to 0.01 us and the line to 0.1 us from the measured value: the same to within 0.06 us)
    assert lines[1].startswith("hetauto probe-link: latency ") and lines[1].split()[4] == "us", lines[1]
    assert abs(float(lines[1].split()[3]) - res["latency_us"]) <= 0.06, (lines[1], res["latency_us"])
    assert [line.split(": ")[1] for line in lines[2:]] == [f"size {i}/5" for i in range(1, 6)]
    assert [int(line.split()[4].replace(",", "")) for line in lines[2:]] == [r["bytes"] for r in res["per_size"]]


def test_probe_link_bad_inputs_exit_2(capsys):
    assert main(["probe-link", "--rank", "0"]) == 2
    assert main(["probe-link", "--rank", "0", "--master", "nohostport"]) == 2
    assert main(["probe-link", "--rank", "3", "--master", "127.0.0.1:1"]) == 2
    # Nobody answers: the rendezvous times out with a one-paragraph error, never a hang.
    assert main(["probe-link", "--rank", "1", "--master", "127.0.0.1:9", "--timeout", "2"]) == 2
    err = capsys.readouterr().err
    assert "HOST:PORT" in err and "could not reach" in err and "Traceback" not in err
    # --local runs both sides here: a --rank or --master beside it would be ignored in silence
    assert main(["probe-link", "--local", "--master", "10.0.0.1:29500"]) == 2
    assert "field '--master'" in capsys.readouterr().err


def test_probe_link_max_size_is_honoured_up_to_its_cap(capsys):
    """--max-size-mib 256 silently stopped at 64 MiB: the sizes now go up by 4x to it, and above the cap
    (1024 MiB: a buffer of the largest message per connection on both hosts) it is refused, saying the cap."""
    from hetauto_megatron.measure.probe_link import DEFAULT_SIZES, message_sizes
    assert message_sizes(256 << 20)[-1] == 256 << 20 and message_sizes(64 << 20) == DEFAULT_SIZES
    assert message_sizes(1 << 30)[-1] == 1 << 30 and message_sizes(100) == (1024,)
    assert main(["probe-link", "--local", "--max-size-mib", "4096", "--iters", "1", "--timeout", "60"]) == 2
    err = capsys.readouterr().err
    assert "--max-size-mib" in err and "at most 1024 MiB" in err and "Traceback" not in err


def test_probe_link_max_size_below_the_smallest_message_is_refused(capsys):
    """--max-size-mib 0.0001 (about 105 bytes) still probed a 1 KiB message, beyond the limit: a limit below the
    smallest message the probe sends (1 KiB) is refused, naming the smallest accepted value, which probes that
    message alone."""
    from hetauto_megatron.measure.probe_link import message_sizes
    assert main(["probe-link", "--local", "--max-size-mib", "0.0001", "--iters", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert "field '--max-size-mib'" in captured.err and "got 0.0001" in captured.err
    smallest = "0.0009765625"          # 1 KiB in MiB
    assert f"give --max-size-mib {smallest} or more" in captured.err
    assert message_sizes(float(smallest) * (1 << 20)) == (1024,)


def test_probe_link_sides_started_with_different_options_stop_with_one_paragraph():
    """The two sides of a probe each wait for the messages their own options give: started with different --iters,
    one side aborted in gloo (a size mismatch, exit 134) and the other printed a traceback. Both now stop at once,
    exit 2, naming the flag and both values."""
    import subprocess
    import sys

    from hetauto_megatron.runtime.launcher import free_port
    master = f"127.0.0.1:{free_port()}"

    def side(rank, iters):
        return subprocess.Popen([sys.executable, "-m", "hetauto_megatron.cli", "probe-link", "--rank", str(rank),
                                 "--master", master, "--timeout", "60", "--max-size-mib", "1", "--iters", str(iters)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    from helpers import kill_launches
    procs = [side(0, 1)]
    try:
        procs.append(side(1, 3))
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:        # (a side still waiting for the other when something above failed)
        kill_launches(procs)
    for p, err in zip(procs, errs):
        assert p.returncode == 2 and "Traceback" not in err, err
        assert "field '--iters'" in err and "--iters: rank 0 1, rank 1 3" in err


def test_a_master_name_that_does_not_resolve_is_said_at_once(capsys):
    """Rank 0 listens at --master, so a name that does not resolve there is refused before any wait (it waited the
    whole --timeout, then blamed the other side); rank 1 is told at once and keeps trying (rank 0's name may appear
    later). '.invalid' never resolves (RFC 2606)."""
    assert main(["probe-link", "--rank", "0", "--master", "nohost.invalid:29600", "--timeout", "60"]) == 2
    err = capsys.readouterr().err
    assert "--master" in err and "does not resolve" in err and "could not reach" not in err and "Traceback" not in err
    assert main(["probe-link", "--rank", "1", "--master", "nohost.invalid:29600", "--timeout", "2"]) == 2
    err = capsys.readouterr().err
    assert err.index("does not resolve") < err.index("could not reach the other side")


# `hetauto probe-link` as its own process, through the command line's entry (cli.main on sys.argv), run as a file so
# that --local's spawned second process imports it too (as __mp_main__): in each process an object held by sys says
# so on fd 1 if the interpreter is torn down (the clean end, os._exit, skips it). With "peer-aborts" the second
# process aborts as it ends, as a gloo thread aborted a finished rank in its teardown (SIGABRT, pytorch#190489).
PROBE_ENTRY = r"""
import atexit, os, sys

class Teardown:
    def __init__(self, who):
        self.who = who
    def __del__(self, write=os.write):
        write(1, f"{self.who} teardown\n".encode())

if __name__ == "__mp_main__":       # --local's second process (rank 1)
    sys.hetauto_teardown = Teardown("rank 1")
    if os.environ.get("PEER_END") == "peer-aborts":
        atexit.register(os.abort)
else:
    sys.hetauto_teardown = Teardown("rank 0")
    from hetauto_megatron.cli import main
    sys.exit(main())
"""


@pytest.mark.parametrize("end, code", [("clean", 0), ("peer-aborts", 1)])
def test_probe_link_local_ends_both_processes_cleanly_and_checks_the_second(tmp_path, end, code):
    """Both processes of `probe-link --local` joined a gloo world: each now ends as a Megatron rank does (groups
    destroyed, atexit handlers run, no interpreter teardown, where a gloo thread can abort a probe that succeeded),
    and the second process's exit status is checked: before, one that aborted left the command at exit 0 with its
    figures; now the run failed, one paragraph naming the signal, exit 1, and --json's error object."""
    import os
    import subprocess
    import sys

    entry = tmp_path / "probe_entry.py"
    entry.write_text(PROBE_ENTRY)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PEER_END=end, PYTHONPATH=root)
    r = subprocess.run([sys.executable, str(entry), "probe-link", "--local", "--max-size-mib", "0.25", "--iters", "1",
                        "--timeout", "60", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == code, r.stdout + r.stderr
    assert "teardown" not in r.stdout, r.stdout
    assert "Traceback" not in r.stderr, r.stderr
    if code == 0:
        assert json.loads(r.stdout)["link"]["bandwidth_gbps"] > 0
    else:
        said = "hetauto probe-link: the run failed: --local's second process (rank 1) was killed by SIGABRT"
        assert said in r.stderr, r.stderr
        assert json.loads(r.stdout)["error"]["kind"] == "run failed", r.stdout
