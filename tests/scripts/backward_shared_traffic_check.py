"""scripts/backward_shared_traffic.py against the byte counts worked out by hand for the two tilings
the kernel runs (d 128 with 64 query rows, d 64 with 128), and its refusals."""
import json

from script_checks import expect_refusal, run_script


def traffic(*args):
    result = run_script("backward_shared_traffic.py", *args, "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    return out, {row["operation"].split(" (")[0]: row["bytes"] for row in out["operations"]}


# d 128, 64 query rows: S^T per warpgroup and k16 step reads A (64 keys x 16 x 2 B = 2048) and B
# (64 queries x 16 x 2 B = 2048), 8 steps over d, 2 warpgroups: 65536. dV's B (128 x 16 x 2 = 4096)
# over 4 steps of queries, 2 warpgroups: 32768. dQ by columns: A (64 x 16 x 2) + B (64 x 16 x 2)
# over 8 steps of keys, 2 warpgroups: 65536. dS^T: 128 x 64 x 2 = 16384; a dQ slice pass: 64 x
# 128 x 4 = 32768; Q_i and dO_i: 2 x 64 x 128 x 2 = 32768; LSE_i and D_i: 2 x 64 x 4 = 512 in,
# 8 warps x 2 x 8 wavefronts x 128 B = 16384 out.
out, ops = traffic("--head-dim", "128", "--query-rows", "64")
assert out["dq_split"] == "columns"
assert ops["S^T = K_j Q_i^T"] == 65536 and ops["dP^T = V_j dO_i^T"] == 65536, ops
assert ops["dV += P^T dO_i"] == 32768 and ops["dK += dS^T Q_i"] == 32768, ops
assert ops["dQ slice = dS K_j"] == 65536, ops
assert ops["dS^T stored"] == 16384 and ops["dQ slices staged"] == 32768, ops
assert ops["Q_i, dO_i written by TMA"] == 32768 and ops["LSE_i, D_i written by TMA"] == 512, ops
assert ops["LSE_i, D_i read"] == 16384, ops
assert out["wgmma_operand_bytes"] == 262144 and out["total_bytes"] == 393728, out
assert out["tensor_cycles"] == 2560 and abs(out["shared_cycles"] - 3076) < 1, out  # 10 x 128 x 64 x 128 / 4096

# d 64, 128 query rows, dQ by rows: S^T per step A 2048 + B (128 x 16 x 2 = 4096), 4 steps, 2
# warpgroups: 49152; dV's B (64 x 16 x 2 = 2048) over 8 steps, 2 warpgroups: 32768; dQ: A (64 x 16
# x 2) + B (64 x 16 x 2) over 8 steps, 2 warpgroups: 65536; dS^T 128 x 128 x 2 = 32768.
out, ops = traffic("--head-dim", "64", "--query-rows", "128")
assert out["dq_split"] == "rows"
assert ops["S^T = K_j Q_i^T"] == 49152 and ops["dV += P^T dO_i"] == 32768, ops
assert ops["dQ slice = dS K_j"] == 65536 and ops["dS^T stored"] == 32768, ops
assert out["wgmma_operand_bytes"] == 229376, out

# d 128 by turns: one warpgroup reads A (64 x 16 x 2 = 2048) and B (128 x 16 x 2 = 4096) over 8
# steps of keys: 49152, 16384 fewer than by columns.
out, ops = traffic("--head-dim", "128", "--query-rows", "64", "--dq-split", "turns")
assert ops["dQ slice = dS K_j"] == 49152 and out["total_bytes"] == 393728 - 16384, (ops, out)

# The table names the same totals.
table = run_script("backward_shared_traffic.py", "--head-dim", "128", "--query-rows", "64")
assert table.returncode == 0 and "| wgmma operands | 262144 |" in table.stdout, table.stdout

expect_refusal(run_script("backward_shared_traffic.py", "--head-dim", "100", "--query-rows", "64"), "--head-dim 100")
expect_refusal(run_script("backward_shared_traffic.py", "--head-dim", "128", "--query-rows", "72"), "--query-rows 72")
expect_refusal(run_script("backward_shared_traffic.py", "--head-dim", "128", "--query-rows", "64", "--dq-split", "rows"),
               "--dq-split rows")
expect_refusal(run_script("backward_shared_traffic.py", "--head-dim", "64", "--query-rows", "128", "--dq-split", "turns"),
               "--dq-split turns")
print("backward_shared_traffic.py: byte counts and refusals as worked out by hand")
