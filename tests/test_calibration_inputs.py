"""The readers (and the nccl-tests writer) behind ``dessim calibrate``.

Real inputs live in tests/data/calibration (README.md there cites each one). What these tests
pin: each reader on the real samples, checked against published numbers; write -> read round
trips of nccl-tests output; every documented error, with messages that name the file and the
line or column; and fuzzing: arbitrary bytes, arbitrary text and mutated real samples give either
a result or a TraceError, never another exception.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dessim.errors import TraceError
from dessim.trace import (
    CollectiveMeasurement,
    KernelMeasurement,
    KinetoTrace,
    read_kernel_csv,
    read_kineto,
    read_nccl_tests,
    write_nccl_tests,
)
from dessim.trace.kineto import parse_nccl_kernel_name
from dessim.trace.nccl_tests import NCCL_TESTS_OPS, format_nccl_float

DATA = Path(__file__).parent / "data" / "calibration"
H100_LOG = DATA / "nccl_tests_allreduce_16xH100_a3mega.txt"
EFA_LOG = DATA / "nccl_tests_allreduce_16xA100_p4d_efa_old_format.txt"
SENDRECV_LOG = DATA / "nccl_tests_sendrecv_8xA100_playground.txt"
KERNEL_CSV = DATA / "kernel_times_h100_published.csv"
HTA_TRACE = DATA / "kineto_gemm_backward_a100_hta.json"
SDPA_TRACE = DATA / "kineto_sdpa_mi300x_tracelens_excerpt.json"

FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def raises_trace_error(match: str):
    return pytest.raises(TraceError, match=match)


# ============================================================================================
# nccl-tests: the real logs
# ============================================================================================


def test_new_format_h100_log_reads_with_the_published_numbers():
    log = read_nccl_tests(H100_LOG)
    assert (log.op, log.ranks, log.version, log.cputime) == ("allreduce", 16, None, False)
    assert log.devices == ("NVIDIA H100 80GB HBM3",) * 16
    assert log.avg_busbw_GBps == 70.742
    assert len(log.rows) == 31
    last = log.rows[-1]
    assert (last.size_bytes, last.count, last.dtype, last.redop, last.root) == (
        8589934592, 2147483648, "float", "sum", -1)
    assert last.time_s == pytest.approx(47535e-6, rel=1e-12)
    assert (last.algbw_GBps, last.busbw_GBps, last.wrong) == (180.71, 338.82, 0)
    assert last.in_place_time_s == pytest.approx(47743e-6, rel=1e-12)
    assert (last.in_place_algbw_GBps, last.in_place_busbw_GBps) == (179.92, 337.35)
    assert last.line == 62 and log.rows[0].line == 32
    # the footer is the mean busbw of every half of every row (nccl-tests src/common.cu)
    halves = [r.busbw_GBps for r in log.rows] + [r.in_place_busbw_GBps for r in log.rows]
    assert sum(halves) / len(halves) == pytest.approx(log.avg_busbw_GBps, abs=0.005)


def test_old_format_log_with_mpi_tags_and_info_lines_reads():
    log = read_nccl_tests(EFA_LOG)
    assert (log.op, log.ranks) == ("allreduce", 16)
    assert log.devices == ("A100-SXM4-40GB",) * 16
    assert log.avg_busbw_GBps == 7.80081
    assert len(log.rows) == 28
    first, last = log.rows[0], log.rows[-1]
    assert (first.size_bytes, first.root, first.redop, first.wrong) == (8, None, "sum", 2e-07)
    assert first.time_s == pytest.approx(167.5e-6)
    assert (last.size_bytes, last.algbw_GBps, last.busbw_GBps) == (1073741824, 17.44, 32.71)
    assert last.time_s == pytest.approx(61556e-6) and last.in_place_wrong == 5e-07


def test_sendrecv_log_needs_ranks_since_its_busbw_factor_is_one():
    with raises_trace_error(r"playground\.txt: cannot tell the rank count.*sendrecv.*ranks="):
        read_nccl_tests(SENDRECV_LOG)
    log = read_nccl_tests(SENDRECV_LOG, ranks=8)
    assert (log.op, log.ranks, log.devices, log.avg_busbw_GBps) == ("sendrecv", 8, (), None)
    assert [r.busbw_GBps for r in log.rows] == [110.81, 188.60, 192.75, 195.10]
    assert log.rows[0].wrong == 0 and log.rows[0].in_place_wrong is None


def _without_rank_lines(path: Path) -> str:
    return "".join(line for line in path.read_text().splitlines(keepends=True)
                   if "Rank" not in line)


def test_rank_count_is_solved_from_busbw_over_algbw_when_no_rank_lines():
    text = _without_rank_lines(H100_LOG)
    with raises_trace_error(r"<text>: cannot tell which collective.*pass op="):
        read_nccl_tests(text)
    log = read_nccl_tests(text, op="allreduce")
    assert log.ranks == 16 and log.devices == ()


def test_rank_count_argument_wins_and_a_wrong_one_is_caught_by_the_row_checks():
    with raises_trace_error(r"a3mega\.txt:\d+: out-of-place busbw .* 8 ranks, from the ranks="):
        read_nccl_tests(H100_LOG, ranks=8)


def test_op_comes_from_argument_then_test_name_then_file_name(tmp_path):
    text = write_nccl_tests("allgather", 4, [(4096, 1e-5)])
    assert read_nccl_tests(text).op == "allgather"      # '# Collective test concluded:'
    renamed = tmp_path / "my_reduce_scatter_run.log"
    renamed.write_text(_without_rank_lines(H100_LOG).replace("all_reduce", "x"))
    with raises_trace_error(r"my_reduce_scatter_run\.log:\d+: busbw/algbw = .* is more than "
                            r"reducescatter gives for any rank count"):
        read_nccl_tests(renamed)                          # the name says reducescatter
    assert read_nccl_tests(renamed, op="all-reduce").ranks == 16


# ============================================================================================
# nccl-tests: the writer and round trips
# ============================================================================================


@pytest.mark.parametrize("value,width,text", [
    (12.345, 7, "  12.35"), (1234.5678, 7, "1234.57"), (12345.67, 7, "12345.7"),
    (123456.7, 7, " 123457"), (12345678.9, 7, "1.2e+07"), (0.001, 6, "  0.00"),
    (123.456, 6, "123.46"), (1234.5, 6, "1234.5"), (123456.0, 6, "123456"), (1.2e6, 6, " 1e+06"),
    (9999.999, 7, "10000.0"), (99.999, 6, "100.00"), (999.999, 6, "1000.0"),
])
def test_numbers_are_printed_like_nccl_tests_getFloatStr(value, width, text):
    assert format_nccl_float(value, width) == text


def test_writer_prints_the_nccl_tests_layout():
    text = write_nccl_tests("allreduce", 8, [(1 << 30, 5.123e-3)], devices="NVIDIA H100")
    lines = text.splitlines()
    assert lines[0] == "# nccl-tests version 2.19.6"
    assert lines[4] == "#  Rank  0 Group  0 Pid      0 on     dessim device  0 [0000:00:00] NVIDIA H100"
    assert ("#       size         count      type   redop    root     time   algbw   busbw  #wrong"
            "     time   algbw   busbw  #wrong ") in lines
    assert ("  1073741824     268435456     float     sum      -1  5123.00  209.59  366.79    N/A"
            "  5123.00  209.59  366.79    N/A") in lines
    assert lines[-2] == "# Collective test concluded: all_reduce_perf"


@pytest.mark.parametrize("op", list(NCCL_TESTS_OPS))
def test_every_op_round_trips(op):
    sizes = [1024 * 2 ** i for i in range(0, 22, 3)]
    rows = [(s, 2e-6 + s / 180e9, 2.5e-6 + s / 170e9) for s in sizes]
    log = read_nccl_tests(write_nccl_tests(op, 8, rows, dtype="bf16"))
    assert (log.op, log.ranks, len(log.rows)) == (op, 8, len(rows))
    for row, (size, t_out, t_in) in zip(log.rows, rows):
        assert (row.size_bytes, row.dtype) == (size, "bfloat16")
        assert row.count == size // 2 // (8 if op in ("allgather", "reducescatter", "alltoall") else 1)
        assert row.time_s == float(format_nccl_float(t_out * 1e6, 7)) / 1e6
        assert row.in_place_time_s == float(format_nccl_float(t_in * 1e6, 7)) / 1e6
        assert abs(row.time_s - t_out) <= 0.05e-6


@given(op=st.sampled_from(list(NCCL_TESTS_OPS)), ranks=st.integers(1, 600),
       dtype=st.sampled_from(["float", "half", "double", "int8", "f8e5m2"]),
       rows=st.lists(st.tuples(st.integers(0, 2 ** 20), st.floats(1e-9, 1e3),
                               st.floats(1e-9, 1e3)), min_size=1, max_size=6))
@FUZZ
def test_write_then_read_round_trips_to_print_precision(op, ranks, dtype, rows):
    per = {"float": 4, "half": 2, "double": 8, "int8": 1, "f8e5m2": 1}[dtype]
    per *= ranks if op in ("allgather", "reducescatter", "alltoall") else 1
    rows = [(n * per, t, t2) for n, t, t2 in rows]
    log = read_nccl_tests(write_nccl_tests(op, ranks, rows, dtype=dtype), op=op)
    assert log.ranks == ranks
    for row, (size, t_out, t_in) in zip(log.rows, rows, strict=True):
        assert row.size_bytes == size
        for got, want in ((row.time_s, t_out), (row.in_place_time_s, t_in)):
            printed = format_nccl_float(want * 1e6, 7)
            assert got == float(printed) / 1e6


def test_writer_rejects_bad_rows():
    with raises_trace_error(r"rows\[0\]: size 1002 B is not a whole number of float elements"):
        write_nccl_tests("allreduce", 8, [(1002, 1e-3)])
    with raises_trace_error(r"rows\[0\]: size 4096 B .* per rank \(3 ranks\)"):
        write_nccl_tests("allgather", 3, [(4096, 1e-3)])
    with raises_trace_error(r"rows\[1\]: time_s must be a finite number of seconds > 0"):
        write_nccl_tests("allreduce", 8, [(4096, 1e-3), (4096, -1.0)])
    with raises_trace_error(r"unknown data type 'int4'"):
        write_nccl_tests("allreduce", 8, [(4096, 1e-3)], dtype="int4")
    with raises_trace_error(r"unknown collective 'gather'"):
        write_nccl_tests("gather", 8, [(4096, 1e-3)])
    with raises_trace_error(r"no rows to write"):
        write_nccl_tests("allreduce", 8, [])
    with raises_trace_error(r"ranks must be a whole number >= 1"):
        write_nccl_tests("allreduce", 0, [(4096, 1e-3)])
    with raises_trace_error(r"rows\[0\]: time 1e\+300 does not fit nccl-tests' 7-character"):
        write_nccl_tests("allreduce", 8, [(4096, 1e294)])


def _nccl_json(ranks=4, cpu=False):
    """A document shaped like nccl-tests -J output (src/util.cu: numbers printed with "%lf")."""
    tkey = "cpu_time" if cpu else "time"
    results = []
    for size, t in ((4096 * ranks, 1.5e-5), (1 << 22, 4e-5)):
        alg = size / t / 1e9
        half = {tkey: round(t * 1e6, 6), "alg_bw": round(alg, 6),
                "bus_bw": round(alg * (ranks - 1) / ranks, 6), "nwrong": 0.0}
        results.append({"size": size, "count": size // 4 // ranks, "type": "float",
                        "redop": "none", "root": "    -1", "out_of_place": half,
                        "in_place": dict(half, nwrong=None), "actual_iterations": 20,
                        "experiment_name": ""})
    return {"version": 2, "args": ["./build/all_gather_perf", "-b", "8"],
            "config": {"nthreads": 1, "ngpus": 1},
            "devices": [{"rank": i, "device_info": "NVIDIA H100"} for i in range(ranks)],
            "results": results, "average_bus_bandwidth": {"bandwidth": 1.5, "okay": "unchecked"}}


def test_nccl_tests_json_output_reads():
    log = read_nccl_tests(json.dumps(_nccl_json(), indent=1))
    assert (log.op, log.ranks, log.avg_busbw_GBps, len(log.rows)) == ("allgather", 4, 1.5, 2)
    assert log.rows[0].root == -1 and log.rows[0].in_place_wrong is None
    assert read_nccl_tests(json.dumps(_nccl_json(cpu=True), indent=1)).cputime


def test_nccl_tests_json_errors_name_the_key():
    doc = _nccl_json()
    doc["results"][1]["in_place"]["bus_bw"] = 999.0
    with raises_trace_error(r"<text>: key results\[1\]: in-place busbw 999.0 GB/s"):
        read_nccl_tests(json.dumps(doc, indent=1))
    doc = _nccl_json()
    del doc["results"][0]["out_of_place"]["alg_bw"]
    with raises_trace_error(r"key results\[0\]\.out_of_place: missing key 'alg_bw'"):
        read_nccl_tests(json.dumps(doc, indent=1))
    with raises_trace_error(r"<text>:2: not valid JSON"):
        read_nccl_tests('{"results": [\n')


# ============================================================================================
# nccl-tests: errors
# ============================================================================================

H100_TEXT = H100_LOG.read_text()
ROW_2M = ("     2097152        524288     float     sum      -1    254.0    8.26   15.48      0"
          "    252.9    8.29   15.55      0")


def _edit_row(new: str) -> str:
    assert ROW_2M in H100_TEXT
    return H100_TEXT.replace(ROW_2M, new)


@pytest.mark.parametrize("row,message", [
    (ROW_2M.replace("15.48", "16.48"),
     r"<text>:50: out-of-place busbw 16.48 GB/s is not algbw 8.26 GB/s × 1.875 .* 16 ranks"),
    (ROW_2M.replace("254.0", "354.0"),
     r"<text>:50: out-of-place algbw 8.26 GB/s is not size 2097152 B / time 354.0 us"),
    (ROW_2M.replace("252.9", "-252.9"), r"<text>:50: in-place time -252.9 is negative"),
    (ROW_2M.replace("float", "qfloat"), r"<text>:50: unknown data type 'qfloat'"),
    (ROW_2M.replace("524288", "524289"),
     r"<text>:50: count 524289 × 4 B \(float\) = 2097156 B, but size is 2097152 B"),
    (ROW_2M + "   7", r"<text>:50: 14 columns, but the header at line 30 has 13"),
    (ROW_2M.replace("8.26", "nan"), r"<text>:50: out-of-place algbw is 'nan', not a finite"),
    (ROW_2M.replace("8.26", "8.2.6"), r"<text>:50: out-of-place algbw '8.2.6' is not a number"),
])
def test_bad_rows_raise_errors_naming_the_line(row, message):
    with raises_trace_error(message):
        read_nccl_tests(_edit_row(row), op="allreduce")


def test_nccl_tests_file_level_errors(tmp_path):
    bad = tmp_path / "all_reduce.log"
    bad.write_bytes(H100_LOG.read_bytes().replace(b"HBM3\n#  Rank  9", b"HBM3\xff\n#  Rank  9"))
    with raises_trace_error(r"all_reduce\.log:20: not UTF-8 text \(byte 0xff"):
        read_nccl_tests(bad)
    with raises_trace_error(r"nothing\.log: cannot read"):
        read_nccl_tests(tmp_path / "nothing.log")
    with raises_trace_error(r"<bytes>: not a readable gzip file"):
        read_nccl_tests(b"\x1f\x8b\x08\x00garbage")
    with raises_trace_error(r"<text>: no nccl-tests results table"):
        read_nccl_tests("just\nsome text\n")
    header_only = H100_TEXT.split("           8             2")[0]
    with raises_trace_error(r"<text>: the results table at line 30 has no rows"):
        read_nccl_tests(header_only, op="allreduce")
    with raises_trace_error(r"<text>:\d+: a second results table starts here \(the first at line 30"):
        read_nccl_tests(H100_TEXT + H100_TEXT, op="allreduce")
    with raises_trace_error(r"unknown collective 'gather'"):
        read_nccl_tests(H100_LOG, op="gather")
    with raises_trace_error(r"the log is of 'gather_perf'"):
        read_nccl_tests(H100_TEXT + "# Collective test concluded: gather_perf\n")
    with raises_trace_error(r"ranks must be a whole number >= 1, got 0"):
        read_nccl_tests(H100_LOG, ranks=0)
    with raises_trace_error(r"expected a path, text or bytes, got int"):
        read_nccl_tests(42)


def test_gzipped_log_reads(tmp_path):
    path = tmp_path / "all_reduce_perf.log.gz"
    path.write_bytes(gzip.compress(H100_LOG.read_bytes()))
    assert read_nccl_tests(path).rows[-1].busbw_GBps == 338.82


# ============================================================================================
# Kernel CSV
# ============================================================================================


def test_published_h100_kernel_figures_read_back():
    rows = read_kernel_csv(KERNEL_CSV)
    assert len(rows) == 9
    gemm = rows[0]
    assert (gemm.kind, gemm.shape, gemm.dtype, gemm.gpu, gemm.phase, gemm.line) == (
        "matmul", (1, 1024, 2048, 256), "bf16", "H100", "fwd", 5)
    assert gemm.time_s == pytest.approx(7.696e-6, rel=1e-12)
    assert rows[1].shape == (2, 256, 2048, 2048) and rows[1].name == "bmm"
    # XLA's sm_90 table figures (FLOP/s), to the published digits
    xla = [139519467775467, 332247798870580, 524288000000000, 631984593290170,
           712739345502821, 783328793548203, 401589990188086]
    for row, flops_per_s in zip(rows[:7], xla):
        assert row.flops / row.time_s == pytest.approx(flops_per_s, rel=1e-6)
    attention = rows[7]
    assert (attention.kind, attention.shape, attention.causal, attention.phase, attention.impl) == (
        "attention", (2, 16, 8192, 8192, 128), True, "fwd+bwd", "flash2")
    assert attention.flops / attention.time_s == pytest.approx(327.9e12, rel=1e-6)
    copy = rows[8]
    assert (copy.kind, copy.bytes, copy.dtype, copy.flops) == ("memory", 536870912, None, None)
    assert copy.bytes / copy.time_s == pytest.approx(2.90e12, rel=1e-6)


CSV_HEADER = "kernel,shape,dtype,time_us\n"


def test_csv_columns_are_case_insensitive_in_any_order_with_units_in_time_column():
    rows = read_kernel_csv("Time,DTYPE,Kernel,Shape,Phase,Causal\n"
                           "1.5ms,fp16,sdpa,1x8x1024x1024x64,bwd,yes\n"
                           "250ns,,rmsnorm,64KiB,,\n")
    assert rows[0].time_s == pytest.approx(1.5e-3) and rows[1].time_s == pytest.approx(2.5e-7)
    assert rows[0].flops == 4.0 * 8 * 1024 * 1024 * 64 / 2 * 2.5
    assert rows[1].bytes == 65536 and rows[1].name == "rmsnorm"


def test_attention_flop_convention():
    base = dict(kind="attention", shape=(2, 4, 128, 256, 64), dtype="bf16", time_s=1.0)
    fwd = 4.0 * 2 * 4 * 128 * 256 * 64
    assert KernelMeasurement(**base).flops == fwd
    assert KernelMeasurement(**base, causal=True).flops == fwd / 2
    assert KernelMeasurement(**base, phase="bwd").flops == 2.5 * fwd
    assert KernelMeasurement(**base, phase="fwd+bwd").flops == 3.5 * fwd
    assert KernelMeasurement(**base, causal=None).flops is None


@pytest.mark.parametrize("text,message", [
    ("kernel,dtype,time_us\nmatmul,bf16,1\n", r"<text>:1: missing column 'shape'"),
    ("kernel,shape,dtype\nmatmul,1x2x3,bf16\n", r"<text>:1: exactly one time column .* found none"),
    ("kernel,shape,dtype,time_us,time_ms\n", r"<text>:1: exactly one time column .* time_us, time_ms"),
    ("kernel,shape,dtype,tme_us\n", r"<text>:1: unknown column 'tme_us'"),
    ("kernel,shape,Shape,dtype,time\n", r"<text>:1: column 'shape' appears twice"),
    (CSV_HEADER + "matmul,8x8x8,bf16,-3\n", r"<text>:2: column 'time_us': '-3' is negative"),
    (CSV_HEADER + "matmul,8x8x8,bf16,0\n", r"<text>:2: column 'time_us': '0' is zero"),
    (CSV_HEADER + "matmul,8x8x8,bf16,3us\n", r"<text>:2: column 'time_us': '3us' is not a plain"),
    ("kernel,shape,dtype,time\nmatmul,8x8x8,bf16,3\n", r"<text>:2: column 'time': '3' has no unit"),
    ("kernel,shape,dtype,time\nmatmul,8x8x8,bf16,-3us\n", r"<text>:2: column 'time': .*negative"),
    (CSV_HEADER + "matmul,8x8x8,int4,3\n", r"<text>:2: column 'dtype': unknown value 'int4'"),
    (CSV_HEADER + "conv,8x8x8,bf16,3\n", r"<text>:2: column 'kernel': unknown value 'conv'"),
    (CSV_HEADER + "matmul,8x8,bf16,3\n", r"<text>:2: column 'shape': '8x8' is not a matmul shape"),
    (CSV_HEADER + "attention,1x2x3x4,bf16,3\n", r"<text>:2: column 'shape': .*BxHxSqxSkxD"),
    (CSV_HEADER + "matmul,8x0x8,bf16,3\n", r"<text>:2: column 'shape': '8x0x8' has a zero"),
    (CSV_HEADER + "memory,12 parsecs,,3\n", r"<text>:2: column 'shape': .*unknown size unit"),
    (CSV_HEADER + "matmul,8x8x8,,3\n", r"<text>:2: column 'dtype': a matmul kernel needs a data"),
    ("kernel,shape,dtype,time_us,gpu\nmatmul,8x8x8,bf16,3,Z80\n",
     r"<text>:2: column 'gpu': .*unknown GPU 'Z80'"),
    ("kernel,shape,dtype,time_us,causal\nmatmul,8x8x8,bf16,3,true\n",
     r"<text>:2: column 'causal': causal masking applies to attention"),
    ("kernel,shape,dtype,time_us,causal\nattn,1x1x8x8x8,bf16,3,maybe\n",
     r"<text>:2: column 'causal': 'maybe' is not true or false"),
    ("kernel,shape,dtype,time_us,phase\nmatmul,8x8x8,bf16,3,sideways\n",
     r"<text>:2: column 'phase': unknown value 'sideways'"),
    (CSV_HEADER + "matmul,8x8x8,bf16\n", r"<text>:2: 3 cells, but the header \(line 1\) has 4"),
    ("# only a comment\n\n", r"<text>: no header row"),
    (CSV_HEADER, r"<text>: the CSV has a header \(line 1\) but no rows"),
])
def test_csv_errors_name_line_and_column(text, message):
    with raises_trace_error(message):
        read_kernel_csv(text)


def test_csv_file_errors(tmp_path):
    path = tmp_path / "times.csv"
    path.write_bytes(b"kernel,shape,dtype,time_us\nmatmul,8x8x8,bf16,3\nmemory,1MiB,,\xe9\n")
    with raises_trace_error(r"times\.csv:3: not UTF-8 text \(byte 0xe9"):
        read_kernel_csv(path)
    path.write_text(CSV_HEADER + "matmul,8x8x8,bf16,3\nmatmul,8x8x8,bf16,1e999\n")
    with raises_trace_error(r"times\.csv:3: column 'time_us': '1e999' is not a finite time"):
        read_kernel_csv(path)


# ============================================================================================
# Kineto traces
# ============================================================================================


def test_hta_backward_gemm_links_through_its_launch():
    trace = read_kineto(HTA_TRACE)
    assert isinstance(trace, KinetoTrace) and trace.collectives == ()
    (gemm,) = trace.kernels
    assert (gemm.kind, gemm.shape, gemm.dtype, gemm.phase, gemm.launches) == (
        "matmul", (1, 2048, 256, 2048), "fp32", "bwd", 1)
    assert gemm.time_s == pytest.approx(45e-6)
    assert gemm.name.startswith("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm")
    assert gemm.flops == 2.0 * 2048 * 256 * 2048 and trace.gemms == (gemm,)


def test_sdpa_trace_gives_attention_with_shape_and_causal_flag():
    trace = read_kineto(SDPA_TRACE)
    assert trace.devices == ("AMD Instinct MI300X",) * 8
    first, second = trace.attention
    assert (first.shape, first.dtype, first.causal, first.phase, first.gpu) == (
        (1, 32, 32768, 32768, 128), "bf16", False, "fwd", "MI300X")
    assert first.time_s == pytest.approx(85232.206e-6)
    assert first.flops == 4.0 * 32 * 32768 ** 2 * 128
    # the second call's ops are not in the excerpt: attention by kernel name, shape unknown
    assert (second.shape, second.causal, second.flops, second.name) == ((), None, None, "attn_fwd.kd")


def _event(cat, name, ts, dur, tid=1, pid=7, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def synthetic_trace():
    """SYNTHETIC events in Kineto's schema (no small real trace with NCCL kernels was found):
    an all-reduce with record_param_comms metadata, a split-K GEMM (two kernels, one op), an
    all-gather whose metadata sits on the kernel, and an elementwise kernel."""
    return {"traceEvents": [
        _event("cpu_op", "record_param_comms", 100, 50, **{
            "External id": 1, "Collective name": "allreduce", "In msg nelems": 1048576,
            "Out msg nelems": 1048576, "dtype": "BFloat16", "Group size": 8}),
        _event("cuda_runtime", "cudaLaunchKernel", 110, 5, correlation=11),
        _event("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
               200, 80, tid=20, pid=0, correlation=11, device=0),
        _event("cpu_op", "aten::linear", 300, 40, **{"External id": 2,
               "Input Dims": [[4, 512, 1024], [4096, 1024], [4096]],
               "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"]}),
        _event("cpu_op", "aten::addmm", 305, 30, **{"External id": 3,
               "Input Dims": [[4096], [2048, 1024], [1024, 4096], [], []],
               "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar"]}),
        _event("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32_splitK", 400, 30, tid=7, pid=0,
               **{"External id": 3}),
        _event("kernel", "void cublasLt::splitKreduce_kernel", 430, 2, tid=7, pid=0,
               **{"External id": 3}),
        _event("kernel", "ncclDevKernel_AllGather_RING_LL(x)", 500, 20, tid=20, pid=0, **{
            "Collective name": "_allgather_base", "In msg nelems": 1024, "Out msg nelems": 8192,
            "dtype": "Float", "Group size": 8}),
        _event("kernel", "void at::native::vectorized_elementwise_kernel<4>", 600, 3, tid=7, pid=0),
    ]}


def test_synthetic_trace_nccl_gemm_and_memory_kernels():
    trace = read_kineto(json.dumps(synthetic_trace(), indent=1))
    allreduce, allgather = trace.collectives
    assert allreduce == CollectiveMeasurement("allreduce", "ring", "ll", 1048576 * 2, 8, 80e-6,
                                              "<text>", allreduce.name, "BFloat16")
    assert (allgather.op, allgather.size_bytes, allgather.ranks) == ("allgather", 8192 * 4, 8)
    (gemm,) = trace.gemms
    assert (gemm.shape, gemm.dtype, gemm.launches, gemm.phase) == ((1, 2048, 4096, 1024), "bf16",
                                                                    2, "fwd")
    assert gemm.time_s == pytest.approx(32e-6) and gemm.name.startswith("sm90_xmma_gemm")
    (memory,) = trace.memory
    assert memory.shape == () and memory.time_s == pytest.approx(3e-6)


def test_old_schema_and_gzip_and_bare_event_list(tmp_path):
    events = synthetic_trace()["traceEvents"]
    for e in events:
        e["cat"] = {"cpu_op": "Operator", "kernel": "Kernel", "cuda_runtime": "Runtime"}[e["cat"]]
        if "External id" in e["args"]:
            e["args"]["external id"] = e["args"].pop("External id")
    path = tmp_path / "rank0.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps(events).encode()))
    trace = read_kineto(path)
    assert len(trace.collectives) == 2 and trace.gemms[0].shape == (1, 2048, 4096, 1024)


@pytest.mark.parametrize("name,parsed", [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     ("allreduce", "ring", "ll")),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_NVLS_SIMPLE", ("reducescatter", "nvls", "simple")),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", ("sendrecv", None, None)),
    ("ncclDevKernel_Generic_1(x)", ("generic", None, None)),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", ("allgather", "ring", "ll")),
    ("ncclAllReduceTreeLL128Kernel_sum_f16(ncclColl)", ("allreduce", "tree", "ll128")),
    ("void at::native::vectorized_elementwise_kernel<4>", None),
])
def test_nccl_kernel_names(name, parsed):
    assert parse_nccl_kernel_name(name) == parsed


@pytest.mark.parametrize("doc,message", [
    ('{"traceEvents": 3}', r"<text>: not a Chrome trace"),
    ('{"traceEvents": [7]}', r"<text>: traceEvents\[0\]: an event must be an object"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1}]}',
     r"<text>: traceEvents\[0\]: 'dur' must be a finite number, got None"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": -2}]}',
     r"traceEvents\[0\]: 'dur' is -2.0; it must be >= 0"),
    ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "k", "ts": 1, "dur": 2, "args": []}]}',
     r"traceEvents\[0\]: 'args' must be an object"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": 5, "ts": 1, "dur": 2}]}',
     r"traceEvents\[0\]: 'name' must be a string"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": NaN, "dur": 2}]}',
     r"<text>: not valid JSON \(NaN is not a JSON number\)"),
    ("{\n\n  oops", r"<text>:3: not valid JSON"),
    ("[" * 100000 + "]" * 100000, r"not valid JSON|nested too deeply"),
])
def test_kineto_errors_name_file_and_event(doc, message):
    with raises_trace_error(message):
        read_kineto(doc if "\n" in doc else doc + "\n")


# ============================================================================================
# Fuzzing: a result or a TraceError, never another exception
# ============================================================================================


def _tolerant(reader, data, **kwargs):
    try:
        reader(data, **kwargs)
    except TraceError:
        pass


READERS = [read_nccl_tests, read_kernel_csv, read_kineto]


@pytest.mark.parametrize("reader", READERS)
@given(data=st.binary(max_size=400))
@FUZZ
def test_arbitrary_bytes(reader, data):
    _tolerant(reader, data)


@pytest.mark.parametrize("reader", READERS)
@given(text=st.text(max_size=400))
@FUZZ
def test_arbitrary_text(reader, text):
    _tolerant(reader, text + "\n")


def _mutations(text: str):
    """Real sample text with a few random edits: replace, delete or duplicate spans."""
    edit = st.tuples(st.sampled_from(["replace", "delete", "duplicate"]),
                     st.integers(0, len(text)), st.integers(0, 40), st.text(max_size=8))
    return st.lists(edit, min_size=1, max_size=4).map(lambda edits: _apply(text, edits))


def _apply(text: str, edits) -> str:
    for kind, at, length, new in edits:
        at = min(at, len(text))
        if kind == "replace":
            text = text[:at] + new + text[at + len(new):]
        elif kind == "delete":
            text = text[:at] + text[at + length:]
        else:
            text = text[:at] + text[at:at + length] + text[at:]
    return text + "\n"


@given(text=_mutations(H100_TEXT) | _mutations(EFA_LOG.read_text())
       | _mutations(write_nccl_tests("alltoall", 4, [(4096, 1e-5), (1 << 20, 3e-5)])))
@FUZZ
def test_mutated_nccl_logs(text):
    _tolerant(read_nccl_tests, text)
    _tolerant(read_nccl_tests, text, op="allreduce", ranks=16)


@given(text=_mutations(KERNEL_CSV.read_text()))
@FUZZ
def test_mutated_kernel_csv(text):
    _tolerant(read_kernel_csv, text)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8)
TRACES = [json.loads(HTA_TRACE.read_text()), json.loads(SDPA_TRACE.read_text()), synthetic_trace()]


@given(which=st.integers(0, len(TRACES) - 1), picks=st.lists(
    st.tuples(st.integers(0, 50), st.sampled_from(
        ["ts", "dur", "name", "cat", "ph", "args", "pid", "tid", "id", "External id",
         "correlation", "Input Dims", "Input type", "Concrete Inputs", "In msg nelems",
         "dtype", "Group size", "device"]), JSON_VALUES), min_size=1, max_size=4))
@FUZZ
def test_mutated_kineto_events(which, picks):
    doc = json.loads(json.dumps(TRACES[which]))
    events = doc["traceEvents"]
    for index, key, value in picks:
        event = events[index % len(events)]
        target = event["args"] if key[0].isupper() and isinstance(event.get("args"), dict) else event
        target[key] = value
    _tolerant(read_kineto, json.dumps(doc, indent=1))


@given(text=_mutations(HTA_TRACE.read_text()))
@FUZZ
def test_mutated_kineto_text(text):
    _tolerant(read_kineto, text)


def test_every_reader_result_is_deterministic():
    assert read_nccl_tests(H100_LOG) == read_nccl_tests(H100_LOG)
    assert read_kineto(SDPA_TRACE) == read_kineto(SDPA_TRACE)
    assert read_kernel_csv(KERNEL_CSV) == read_kernel_csv(KERNEL_CSV)
    assert math.isfinite(sum(m.time_s for m in read_kernel_csv(KERNEL_CSV)))
