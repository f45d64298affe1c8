"""What ``--slurm`` reads from SLURM and plans from it, on SLURM's own text (no cluster):
``scontrol show job -d -o`` parsed into each node's share, each rank's threads and GPUs, the
states and their words, and GPU plans that span nodes."""

from __future__ import annotations

from nbdist import devices
from nbdist.hosts.scheduler import JobState, NodeShare
from nbdist.hosts.slurm import describe_end, parse_duration, parse_job

# scontrol show job -d -o 12 on the test bed (2 nodes, --ntasks-per-node=2, 2 fake GPUs each)
RUNNING = ("JobId=12 JobName=nbdist UserId=root(0) JobState=RUNNING Reason=None "
           "Dependency=(null) RunTime=00:00:07 TimeLimit=00:10:00 TimeMin=N/A "
           "NodeList=nbnode[1-2] NumNodes=2 NumCPUs=4 NumTasks=4 CPUs/Task=1 "
           "ReqB:S:C:T=0:0:*:* TRES=cpu=4,node=2,billing=4 Socks/Node=* "
           "NtasksPerN:B:S:C=2:0:*:* CoreSpec=* Nodes=nbnode[1-2] CPU_IDs=0-1 Mem=0 "
           "GRES=gpu:2(IDX:0-1) MinCPUsNode=2")
PENDING = ("JobId=13 JobName=nbdist JobState=PENDING Reason=Resources Dependency=(null) "
           "RunTime=00:00:00 TimeLimit=UNLIMITED NumNodes=3-3 NumCPUs=3 NumTasks=3 "
           "CPUs/Task=1")


def _expand(nodes: str) -> list[str]:
    return {"nbnode[1-2]": ["nbnode1", "nbnode2"], "nbnode3": ["nbnode3"]}[nodes]


def test_a_running_job_gives_each_node_its_ranks_cpus_and_gpus():
    state, shares = parse_job(RUNNING, _expand)
    assert state == JobState("RUNNING", "None", 593.0, "00:10:00") and state.running
    assert shares == [NodeShare("nbnode1", 2, 2, None, (0, 1)),
                      NodeShare("nbnode2", 2, 2, None, (0, 1))]
    assert [shares[0].gpus_of(k) for k in (0, 1)] == [(0,), (1,)]
    assert shares[0].threads() == 1


def test_a_pending_job_and_how_a_job_ends_in_words():
    state, shares = parse_job(PENDING, _expand)
    assert state.pending and not state.ended and state.reason == "Resources" and not shares
    assert JobState("UNKNOWN").ended is False  # slurmctld did not answer: not an end
    assert describe_end(JobState("TIMEOUT", time_limit="00:01:00")) == \
        "TIMEOUT (its time limit, 00:01:00, was reached)"
    assert describe_end(JobState("NODE_FAIL")) == "NODE_FAIL (a node of it failed)"
    assert describe_end(JobState("PREEMPTED")).startswith("PREEMPTED (it was preempted")
    assert parse_duration("1-02:03:04") == 93784 and parse_duration("05:00") == 300
    assert parse_duration("UNLIMITED") is None


def test_threads_follow_cpus_per_task_else_the_node_over_its_ranks():
    assert NodeShare("n", 4, 16).threads() == 4
    assert NodeShare("n", 4, 16, cpus_per_task=2).threads() == 2
    assert NodeShare("n", 3, 2).threads() == 1  # never 0
    four = NodeShare("n", 2, 8, gpus=(0, 1, 2, 3))
    assert [four.gpus_of(k) for k in (0, 1)] == [(0, 1), (2, 3)]  # two GPUs each
    shared = NodeShare("n", 3, 8, gpus=(4, 5))
    assert [shared.gpus_of(k) for k in (0, 1, 2)] == [(4,), (5,), (4,)]


def test_a_gpu_plan_spans_nodes_and_nccl_counts_gpus_per_host():
    names = ["nb", "w1", "w2", "w3", "w4"]
    remote = (("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1))  # cuda:0 on n1 is not n2's
    s = devices.setup("auto", "auto", "auto", names, local=1, visible=1, cuda=True,
                      remote=remote)
    assert [s.device(r) for r in range(5)] == ["cuda:0", "cuda:0", "cuda:1", "cuda:0",
                                               "cuda:1"]
    assert s.backend == "nccl"  # every rank has a GPU of its own, on its own host
    assert s.maps["w1"]["w4"] == {"cuda:0": "cuda:1"}
    cpu = devices.setup("none", "auto", None, names, 1, 1, True, remote)
    assert cpu.plan.devices == (None,) * 5 and cpu.backend == "gloo"
    shared = devices.setup("auto", "auto", None, names, 1, 1, True,
                           (("n1", 0), ("n1", 0), ("n2", 0), ("n2", 1)))
    assert shared.backend == "gloo" and "ranks share GPUs" in shared.note
