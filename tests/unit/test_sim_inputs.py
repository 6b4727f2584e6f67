"""Market inputs: Bamboo traces, the pools CSV and the synthetic generator; bad input names file and line."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from spotrelay.sim import inputs
from spotrelay.sim.build import MarketOptions, build_market
from spotrelay.sim.inputs import SimInputError, read_bamboo, read_pools_csv
from spotrelay.sim.market import SlotCapacity, TraceCapacity

TRACE = Path(__file__).resolve().parents[2] / "spotrelay" / "local" / "data" / "bamboo-g4dn-trace.csv"
P3_TRACE = TRACE.with_name("bamboo-p3-64-trace.csv")
HANG_S = 300.0  # a wait's bound that only catches a hang (a loaded CI machine may be slow, never this slow)


def test_the_shipped_trace_reads_as_the_issue_describes_it() -> None:
    trace = read_bamboo(TRACE)
    assert 12 < trace.mean_capacity() < 13.5
    assert 0.5 < trace.removals_per_node_hour() < 1.0  # nodes last under two hours on average
    cap = TraceCapacity(trace, 0.0)
    assert max(cap.capacity(t) for t in range(0, int(trace.period_s), 60)) == 24


def test_the_p3_trace_reads_as_bamboos_64_node_recording() -> None:
    # Bamboo's full-64-node-trace.csv (timestamp,count every few minutes, 26-27 July 2021) as add/remove
    # events, from the first count after the cluster's start-up ramp (47) to the last before the recording's
    # teardown (63): docs/simulator-tuning.md, "Reclaim waves"
    trace = read_bamboo(P3_TRACE)
    cap = TraceCapacity(trace, 0.0)
    counts = [cap.capacity(t) for t in range(0, int(trace.period_s), 60)]
    assert counts[0] == 47 and min(counts) == 37 and max(counts) == 75
    assert abs(trace.period_s / 3600 - 5.633) < 0.01 and 59 < trace.mean_capacity() < 60.5


@pytest.mark.parametrize(("text", "line", "what"), [
    ("1000,add,a\nxx,add,b\n", 2, "not a number of milliseconds"),
    ("1000,add,a\nnan,add,b\n", 2, "not a number of milliseconds"),
    ("1000,add,a\ninf,add,b\n", 2, "not a number of milliseconds"),
    ("-1000,add,a\n", 1, "not a number of milliseconds >= 0"),
    ("1000,add,a\n2000,drop,a\n", 2, "not 'add' or 'remove'"),
    ("1000,remove,a\n", 1, "never added"),
    ("2000,add,a\n1000,add,b\n", 2, "backwards"),
    ("1000,add,a\n1500,add\n", 2, "expected"),
])
def test_malformed_trace_names_file_and_line(tmp_path: Path, text: str, line: int, what: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(SimInputError, match=f"{path}:{line}: .*{what}"):
        read_bamboo(path)


@pytest.mark.parametrize("header", ["ms,add|remove,node", "time_ms,event,node", " ms , action , node "])
def test_a_first_row_of_column_names_is_a_header(tmp_path: Path, header: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(f"# a comment\n{header}\n1000,add,a\n3000,remove,a\n")
    assert [(n.add_s, n.remove_s) for n in read_bamboo(path).nodes] == [(1.0, 3.0)]
    path.write_text(f"1000,add,a\n{header}\n3000,remove,a\n")  # only the first row may be one
    with pytest.raises(SimInputError, match=f"{path}:2: time"):
        read_bamboo(path)
    path.write_text("x,add,a\n3000,remove,a\n")  # a first row with an action is data: its time is wrong
    with pytest.raises(SimInputError, match=f"{path}:1: time 'x' is not a number"):
        read_bamboo(path)
    path.write_text(f"{header}\n")
    with pytest.raises(SimInputError, match="no rows"):
        read_bamboo(path)


def test_a_time_written_as_a_decimal_is_the_same_time(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("480000.0,add,a\n540000.7,remove,a\n")  # (as a dataframe writes whole numbers)
    assert [(n.add_s, n.remove_s) for n in read_bamboo(path).nodes] == [(480.0, 540.001)]  # to the ms


HEADER = "timestamp,region,availability_zone,instance_type,spot_price,placement_score,capacity,interruptions_per_hour\n"


def test_pools_csv_holds_price_history_and_placement_scores(tmp_path: Path) -> None:
    path = tmp_path / "pools.csv"
    path.write_text(HEADER + "2025-06-01T00:00:00Z,us-east-1,us-east-1a,p5.48xlarge,21.5,7,24,0.01\n"
                    "2025-06-01T06:00:00Z,us-east-1,us-east-1a,p5.48xlarge,23.0,3,4,\n"
                    "2025-06-01T00:00:00Z,us-east-1,us-east-1c,p5.48xlarge,20,,,\n")
    tables = read_pools_csv(path)
    assert len(tables) == 2
    market = build_market(MarketOptions(traces=[str(path)], trace_format="pools-csv", regions=["us-east-1"],
                                        instance_types=["p5.48xlarge"]), seed=0)
    spot = market.by_key["us-east-1/us-east-1a/p5.48xlarge/spot"]
    assert isinstance(spot.capacity, SlotCapacity)
    assert spot.price(0) == 21.5 and spot.price(7 * 3600) == 23.0
    assert spot.placement_score(7 * 3600) == 3 and spot.capacity.capacity(7 * 3600) == 4


def test_an_on_demand_price_under_a_pools_csvs_spot_prices_is_refused(tmp_path: Path) -> None:
    """EC2 does not bill spot above on-demand: ``--on-demand-price`` under the file's prices is named, with
    the pool and its top price; the file's prices under the catalog's on-demand run as they are."""
    path = tmp_path / "pools.csv"
    path.write_text(HEADER + "0,us-east-1,us-east-1a,p5.48xlarge,21.5,,,\n"
                    "3600,us-east-1,us-east-1a,p5.48xlarge,30,,,\n")
    opts = MarketOptions(traces=[str(path)], trace_format="pools-csv", regions=["us-east-1"],
                         instance_types=["p5.48xlarge"], on_demand_price=25.0)
    with pytest.raises(SimInputError, match=r"--on-demand-price 25: .*pools.csv prices "
                                            r"us-east-1/us-east-1a/p5.48xlarge/spot up to 30 USD per node-hour"):
        build_market(opts, seed=0)
    opts.on_demand_price = 30.0  # (spot at on-demand's price: the edge of a real market)
    assert build_market(opts, seed=0).by_key["us-east-1/us-east-1a/p5.48xlarge/spot"].price(3600) == 30.0
    opts.on_demand_price = None
    assert build_market(opts, seed=0).by_key["us-east-1/us-east-1a/p5.48xlarge/spot"].price(3600) == 30.0
    # a file above the catalog's on-demand (p5's 55.04 in us-east-1) is named too, with the way out
    path.write_text(HEADER + "0,us-east-1,us-east-1a,p5.48xlarge,21.5,,,\n"
                    "3600,us-east-1,us-east-1a,p5.48xlarge,60,,,\n")
    with pytest.raises(SimInputError, match=r"pools.csv prices us-east-1/us-east-1a/p5.48xlarge/spot up to 60 USD "
                                            r"per node-hour, above its on-demand price in the catalog \(55.04\): .*"
                                            r"pass --on-demand-price"):
        build_market(opts, seed=0)
    opts.on_demand_price = 60.0
    assert build_market(opts, seed=0).by_key["us-east-1/us-east-1a/p5.48xlarge/spot"].price(3600) == 60.0


def test_the_synthetic_market_near_on_demand_runs_its_slots_are_not_a_file() -> None:
    """The pools-CSV check is the file's: the synthetic market's slots (spot +-10%) under an --on-demand-price
    just above its spot went through it and crashed naming a file it has none of (IndexError)."""
    market = build_market(MarketOptions(trace_format="synthetic", regions=["us-east-1"], instance_types=["p5.48xlarge"],
                                        on_demand_price=3.0, spot_price=2.9), seed=0)
    spot = [p for p in market.pools if p.spot]
    assert spot
    # ... and no slot bills above on-demand (EC2 interrupts rather than bill more): drawn up to 3.19, capped
    prices = [s.spot_price for p in spot for s in p.capacity.slots]  # type: ignore[union-attr]
    assert max(prices) == 3.0 and min(prices) < 3.0


@pytest.mark.parametrize(("rows", "line", "what"), [
    ("0,us-east-1,us-east-1a,p5.48xlarge,cheap,,,\n", 2, "spot_price 'cheap' is not a number"),  # (no column named)
    ("0,us-east-1,us-east-1a,p5.48xlarge,,,,\n", 2, "spot_price is empty"),
    ("0,us-east-1,us-east-1a,p5.48xlarge,1,high,,\n", 2, "placement_score 'high' is not a number"),
    ("0,us-east-1,us-east-1a,p5.48xlarge,1,,,often\n", 2, "interruptions_per_hour 'often' is not a number"),
    ("yesterday,us-east-1,us-east-1a,p5.48xlarge,1,,,\n", 2, "timestamp 'yesterday' is neither seconds nor an ISO"),
    ("0001-01-01T00:00:00,us-east-1,us-east-1a,p5.48xlarge,1,,,\n", 2, "timestamp '0001-01-01T00:00:00' is out of "),
    ("0,us-east-1,us-east-1a,p5.48xlarge,1,11,,\n", 2, "placement_score"),
    ("0,us-east-1,us-east-1a,p5.48xlarge,0,,,\n", 2, "spot_price '0' must be a finite price above 0"),
    ("0,us-east-1,us-east-1a,p5.48xlarge,inf,,,\n", 2, "spot_price 'inf' must be a finite price above 0"),
    ("0,us-east-1,us-east-1a,p5.48xlarge,1,,2.5,\n", 2, "capacity"),
    ("5,us-east-1,us-east-1a,p5.48xlarge,1,,,\n5,us-east-1,us-east-1a,p5.48xlarge,1,,,\n", 3, "does not increase"),
])
def test_malformed_pools_csv_names_file_and_line(tmp_path: Path, rows: str, line: int, what: str) -> None:
    path = tmp_path / "pools.csv"
    path.write_text(HEADER + rows)
    with pytest.raises(SimInputError, match=f"{path}:{line}: .*{what}"):
        read_pools_csv(path)


@pytest.mark.parametrize(("data", "line", "what"), [
    (HEADER.encode() + b"0,us-east-1,us-east-1a,p5.48xlarge\n", 2,
     "4 fields, the header has 8 .no spot_price, placement_score"),
    (HEADER.encode() + b"0,us-east-1,us-east-1a,p5.48xlarge,1,,,,extra\n", 2, "9 fields, the header has 8"),
    (HEADER.encode() + b"nan,us-east-1,us-east-1a,p5.48xlarge,1,,,\n", 2, "timestamp 'nan' is not a finite time"),
    (HEADER.encode() + b"0,us-east-1,us-east-1a,p5.48xlarge,1,,,\n\xff\xfe,us,us,p5,1,,,\n", 3, "not UTF-8"),
    (HEADER.encode() + b"0,us-east-1,us-east-1a,p5.48xlarge," + b"1" * 200_000 + b",,,\n", 2, "field larger"),
    (HEADER.encode() + b"0,us-east-1,us-east-1a,p5.48xlarge,1,,inf,\n", 2, "capacity inf is not a whole"),
    (HEADER.encode() + b"0,us-east-1,us-east-1a,p5.48xlarge,1,,nan,\n", 2, "capacity nan is not a whole"),
])
def test_pools_csv_rows_that_do_not_fit_the_header_name_file_and_line(tmp_path: Path, data: bytes, line: int,
                                                                     what: str) -> None:
    """A short or long row (csv fills missing fields with None: was an internal TypeError, or silently
    read), a time that is not finite, a binary file, a field past the csv module's limit, a capacity that
    is not finite (internal errors before): each names the file and the line."""
    path = tmp_path / "pools.csv"
    path.write_bytes(data)
    with pytest.raises(SimInputError, match=f"{path}:{line}: {what}"):
        read_pools_csv(path)


def test_a_trace_that_is_not_text_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"1000,add,a\n2000,add,b\n\x00\xff\xfe\x80\n")
    with pytest.raises(SimInputError, match=f"{path}:3: not UTF-8 text"):
        read_bamboo(path)
    path.write_bytes(b"\xef\xbb\xbf1000,add,a\n2000,remove,a\n")  # a UTF-8 byte-order mark is text
    assert read_bamboo(path).nodes[0].add_s == 1.0


def test_a_trace_or_table_that_never_ends_is_refused_not_read_for_ever(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A link to /dev/zero (or any file past the bound) is read up to the bound and refused by name."""
    monkeypatch.setattr(inputs, "MAX_INPUT_BYTES", 1 << 20)
    endless = tmp_path / "trace.csv"
    endless.symlink_to("/dev/zero")
    with pytest.raises(SimInputError, match=f"{endless}: longer than 1 MiB; is this the trace"):
        read_bamboo(endless)
    with pytest.raises(SimInputError, match=f"{endless}: longer than 1 MiB; is this the pools table"):
        read_pools_csv(endless)
    big = tmp_path / "big.csv"
    big.write_bytes(b"1000,add,a\n" * (1 + (1 << 20) // 11))
    with pytest.raises(SimInputError, match="longer than 1 MiB"):
        read_bamboo(big)


def test_pools_csv_header_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "pools.csv"
    path.write_text("timestamp,region,price\n0,us-east-1,1\n")
    with pytest.raises(SimInputError, match=f"{path}:1: header lacks"):
        read_pools_csv(path)


def test_synthetic_market_is_a_function_of_the_seed() -> None:
    opts = MarketOptions(trace_format="synthetic", synthetic_days=2)

    def fingerprint(seed: int) -> list[tuple[float, int | None]]:
        market = build_market(opts, seed)
        return [(p.price(3600.0), p.capacity.capacity(3600.0)) for p in market.pools
                if isinstance(p.capacity, SlotCapacity)]

    assert fingerprint(1) == fingerprint(1)
    assert fingerprint(1) != fingerprint(2)


def test_pool_traces_map_files_to_pools(tmp_path: Path) -> None:
    other = tmp_path / "other.csv"
    other.write_text("0,add,a\n3600000,remove,a\n")
    market = build_market(MarketOptions(traces=[f"us-east-1/*/p5.48xlarge=={other}".replace("==", "="),
                                                str(TRACE)], regions=["us-east-1"]), seed=0)
    p5 = [p for p in market.pools if p.spot and p.pool.instance_type == "p5.48xlarge"]
    p4d = [p for p in market.pools if p.spot and p.pool.instance_type == "p4d.24xlarge"]
    assert all(isinstance(p.capacity, TraceCapacity) and p.capacity.trace.source == str(other) for p in p5)
    assert all(isinstance(p.capacity, TraceCapacity) and p.capacity.trace.source == str(TRACE) for p in p4d)


def _answer(read: Callable[[], object]) -> object:
    """What ``read`` returned or raised, or a failure (not a hung test) when it is still waiting."""
    said: list[object] = []

    def run() -> None:
        try:
            said.append(read())
        except Exception as exc:  # (the test judges it)
            said.append(exc)

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    reader.join(HANG_S)  # only catches a hang: a read takes milliseconds
    assert said, f"still waiting after {HANG_S:.0f} s"
    return said[0]


def test_a_named_pipe_nothing_writes_to_is_an_empty_trace_not_a_wait(tmp_path: Path) -> None:
    """open() of a FIFO waits for a writer: `--trace PIPE` hung for ever before it read a byte. It reads as
    empty now; a pipe that is written (``--trace <(zcat trace.gz)``) is still read whole."""
    pipe = tmp_path / "trace.csv"
    os.mkfifo(pipe)
    said = _answer(lambda: read_bamboo(pipe))
    assert isinstance(said, SimInputError) and f"{pipe}: the trace has no rows" in str(said)
    said = _answer(lambda: read_pools_csv(pipe))
    assert isinstance(said, SimInputError) and str(pipe) in str(said)

    def write() -> None:
        with pipe.open("w") as f:
            f.write("1000,add,a\n")
            time.sleep(0.2)  # (a slow writer: the reader waits for the rest, it does not stop at the pause)
            f.write("3000,remove,a\n")

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    said = _answer(lambda: read_bamboo(pipe))
    assert isinstance(said, inputs.Trace) and [(n.add_s, n.remove_s) for n in said.nodes] == [(1.0, 3.0)], said


@pytest.mark.parametrize("text", ["x" * 1_000_000, ("0,add," + "n" * 1_000_000 + "\n") * 2,
                                  "0,add,a\n5,drop" + "p" * 1_000_000 + ",a\n"])
def test_an_error_quotes_a_long_value_cut_to_a_readable_length(tmp_path: Path, text: str) -> None:
    """A trace of one 50 MB line was echoed whole: the error line was 50 MB."""
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(SimInputError) as caught:
        read_bamboo(path)
    assert len(str(caught.value)) < len(str(path)) + 200 and "characters)" in str(caught.value), str(caught.value)[:300]


def test_a_pools_csv_value_is_quoted_cut_to_a_readable_length(tmp_path: Path) -> None:
    path = tmp_path / "pools.csv"
    path.write_text(HEADER + "0,us-east-1,us-east-1a,p5.48xlarge,1,,1" + "9" * 100_000 + "x,\n")
    with pytest.raises(SimInputError, match=r"pools.csv:2: capacity '1999.*'... \(100,002 characters\) is not a "):
        read_pools_csv(path)


def test_trace_lines_are_counted_as_an_editor_counts_them(tmp_path: Path) -> None:
    """str.splitlines also breaks at a form feed, \\x1c, \\x85 or \\u2028: the error named a later line."""
    path = tmp_path / "t.csv"
    path.write_text("1000,add,a\n2000,add,b\x0c\n3000,drop,c\n")
    with pytest.raises(SimInputError, match=f"{path}:3: action 'drop'"):
        read_bamboo(path)
    path.write_bytes(b"1000,add,a\r2000,remove,a\r")  # (old Mac line ends still end lines)
    assert [(n.add_s, n.remove_s) for n in read_bamboo(path).nodes] == [(1.0, 2.0)]
