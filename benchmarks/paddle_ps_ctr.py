"""PaddlePaddle 3.0.0's own parameter server on ps_vs_pytorch.py's CTR model: one process per role.

Run by ``benchmarks/paddle_peer.py`` under ``.venv-paddle/bin/python`` (scripts/install-paddle-peer.sh),
never by hand in the project's venv. Configured by Paddle's own environment contract, read by
``fleet.init()`` (PaddleCloudRoleMaker, is_collective=False): ``TRAINING_ROLE`` (PSERVER | TRAINER),
``PADDLE_PSERVERS_IP_PORT_LIST``, ``PADDLE_TRAINER_ENDPOINTS``, ``PADDLE_TRAINERS_NUM``,
``PADDLE_TRAINER_ID``, ``POD_IP``, ``PADDLE_PORT``, and Paddle's trainer barrier through gloo
(``PADDLE_WITH_GLOO=1``, file rendezvous ``PADDLE_GLOO_RENDEZVOUS=2``, ``PADDLE_GLOO_FS_PATH``), which
``init_worker`` uses so that trainer 0 has pushed the initial dense values before the others pull them.

The program is Paddle's static-graph CTR-DNN (the model of Paddle's PS CTR benchmark), sized as
ps_vs_pytorch.py's ``build_model``: 26 slots of one id each, every slot looked up with
``paddle.static.nn.sparse_embedding`` in ONE shared table ``emb`` of 1,000,000 rows x 16 (the servers'
MemorySparseTable: rows exist as ids come), the 26 x 16 outputs concatenated after the 13 dense features
into fc 400-400-1 (ReLU), ``binary_cross_entropy_with_logits`` (mean over the batch), Adam lr 1e-3 on the
dense part (run by the servers' dense tables, async), batch 2048, ``fleet.DistributedStrategy().a_sync
= True`` (async PS). The dense weights are the ones PyTorch's ``build_model`` draws for the seed (the
driver writes them as .npy, ``--init``; each trainer sets them in its scope before ``init_worker``,
which pushes trainer 0's to the servers), so every engine starts from the same MLP. Data: the driver's
.npy files; trainer t of T takes every T-th batch of the first ``--batches`` (``my_batches``).
``CPU_NUM=1``, ``OMP_NUM_THREADS=1``, ``MKL_NUM_THREADS=1``: one compute thread per process.

Where Paddle 3.0.0 cannot match the PyTorch / paramshard model exactly (said in RESULTS section 9 too):

- The sparse table's optimizer is Paddle's accessor rule, set the way Paddle sets it, through
  ``strategy.sparse_table_configs`` (the accessor proto of table ``emb``): SparseAccessor (Paddle's CPU
  default without show/click), ``StdAdaGradSGDRule`` (one g2sum per element, as torch's Adagrad) with
  learning_rate 0.05 and initial_range 0.01 on both of its parts (embed_w: column 0; embedx: columns
  1-15), ``zero_init = False`` (so column 0 too starts uniform in [-0.01, 0.01), not at 0). Paddle's rule
  is not torch's Adagrad: ``w -= lr * g * sqrt(g0 / (g0 + G))`` with G the sum of squares BEFORE this
  step and g0 = initial_g2sum (Paddle's default 3, kept), where torch does ``w -= lr * g / sqrt(G + g*g)``;
  and the trainer pushes each row's gradient multiplied by the batch size and the server divides it by
  the row's count in the push ("show"), so a row's step follows its mean per-occurrence gradient of the
  summed loss, not the sum of the mean loss's. Weights are clipped to [-10, 10] (Paddle's default bounds).
- Dense updates: Paddle's client queues each step's dense gradient push and sends only when more
  than ``FLAGS_pserver_push_dense_merge_limit`` (12) are queued, merged into one (or on a flush): the
  servers' Adam takes about one step per 13 trainer steps. The flag is a C++ gflag that Paddle 3.0.0
  does not export (``paddle.set_flags`` and ``FLAGS_*`` variables do not reach it), so it stays at 12:
  at one short epoch Paddle's AUC is not comparable with the others' (a --quick run learns almost
  nothing); its throughput is that of Paddle's defaults.
- The trainer program only pushes in async mode; with ``exe.run`` nothing pulls the servers' dense
  values back (``train_from_dataset``'s device workers run a pull-dense thread for that), so the loop
  calls Paddle's ``pull_dense_params`` after every step (``dense_puller``): one synchronous 1.3 MB pull
  a step, which Paddle's dataset path would overlap.
- Every process gets one compute thread, but Paddle's PS also runs brpc service threads (the service's
  ``server_thread_num = 12``, bthread workers) and a sparse table of 1000 shards; Paddle's defaults, kept.
- Static graph on the legacy program IR: Paddle 3.0 defaults to PIR, whose programs the PS passes do
  not transform, so the worker sets ``FLAGS_enable_pir_api=0`` before importing paddle.

Timing is the paramshard worker's (``SteadyClock``): samples after the first ``--warmup`` steps over the
time from the end of that step to the end of the loop. Each trainer writes ``trainer-<id>.json`` in
``--result`` (the fields ``combine()`` reads) after its loop; the chief then waits (deadline) for the
others' results, pulls the dense values from the servers and runs the test set through the forward
part of its program (the sparse pulls go to the servers, no push), and saves the probabilities as
``probs-0.npy``: the driver computes AUC / logloss with the same code as for every other candidate. The
other trainers stay connected until the chief's result is written, then all call ``fleet.stop_worker()``.
Servers run until the driver stops them (it owns every process, and stops each one in every case).

    TRAINING_ROLE=PSERVER ... .venv-paddle/bin/python benchmarks/paddle_ps_ctr.py --data D --result R ...
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ps_vs_pytorch as B  # noqa: E402  (constants, data layout, the clock: numpy and stdlib only)

TABLE = "emb"          # the one shared sparse table (a parameter name, as Paddle's table configs key it)
WIDTHS = (400, 400, 1)  # the MLP's layers: files w0.npy b0.npy ... w2.npy b2.npy in --init


def table_configs() -> dict:
    """Adagrad lr 0.05, init uniform +-0.01 on the ``emb`` table, in Paddle's accessor proto fields."""
    conf = {}
    for part in ("embed_sgd_param", "embedx_sgd_param"):
        pre = f"table_parameters.{TABLE}.accessor.{part}"
        conf[f"{pre}.name"] = "StdAdaGradSGDRule"
        conf[f"{pre}.adagrad.learning_rate"] = B.TABLE_LR
        conf[f"{pre}.adagrad.initial_range"] = B.INIT
    conf[f"table_parameters.{TABLE}.accessor.ctr_accessor_param.zero_init"] = False
    return {TABLE: conf}


def build_program():
    """The CTR-DNN static program; returns (loss, prob). The fc parameters get torch's distribution
    here (uniform +-1/sqrt(fan_in)): the servers' dense tables take only such an initializer (an Assign
    of given values crashes Paddle's MemoryDenseTable::CreateInitializer with SIGSEGV); the trainers
    then put PyTorch's exact values in their scope (``set_dense_init``) and trainer 0 pushes them."""
    import paddle
    from paddle.nn.initializer import Uniform
    dense = paddle.static.data("dense", [-1, B.DENSE], "float32")
    slots = [paddle.static.data(f"C{k}", [-1, 1], "int64") for k in range(B.FIELDS)]
    label = paddle.static.data("label", [-1, 1], "float32")
    table = paddle.ParamAttr(name=TABLE, initializer=Uniform(-B.INIT, B.INIT))
    rows = [paddle.static.nn.sparse_embedding(s, size=[B.ROWS, B.DIM], param_attr=table) for s in slots]
    x = paddle.concat([dense] + [paddle.reshape(r, [-1, B.DIM]) for r in rows], axis=1)
    for i, width in enumerate(WIDTHS):
        bound = 1 / math.sqrt(x.shape[1])
        x = paddle.static.nn.fc(x, width, activation="relu" if i < len(WIDTHS) - 1 else None,
                                weight_attr=paddle.ParamAttr(name=f"fc{i}_w", initializer=Uniform(-bound, bound)),
                                bias_attr=paddle.ParamAttr(name=f"fc{i}_b", initializer=Uniform(-bound, bound)))
    loss = paddle.nn.functional.binary_cross_entropy_with_logits(x, label)
    return loss, paddle.nn.functional.sigmoid(x)


def set_dense_init(init: Path) -> None:
    """PyTorch's initial MLP for the seed (the driver's w<i>.npy [in, out], b<i>.npy) into this scope."""
    import paddle
    scope, place = paddle.static.global_scope(), paddle.CPUPlace()
    for i in range(len(WIDTHS)):
        for kind in ("w", "b"):
            value = np.load(init / f"{kind}{i}.npy")
            tensor = scope.find_var(f"fc{i}_{kind}").get_tensor()
            if tuple(tensor.shape()) != value.shape:
                raise ValueError(f"{init}/{kind}{i}.npy has shape {value.shape}, the program's fc{i}_{kind} "
                                 f"{tuple(tensor.shape())}: not the same model")
            tensor.set(value, place)


def feeds(dense, ids, labels, batch: int, which) -> list[dict]:
    out = []
    for k in which:
        sl = slice(k * batch, (k + 1) * batch)
        feed = {"dense": np.ascontiguousarray(dense[sl]), "label": labels[sl].reshape(-1, 1)}
        feed.update({f"C{f}": np.ascontiguousarray(ids[sl, f:f + 1]) for f in range(B.FIELDS)})
        out.append(feed)
    return out


def wait_for(result: Path, trainers, timeout: float, why: str) -> None:
    """Until every one of ``trainers`` has written its result (the driver's deadline is the backstop)."""
    deadline = time.monotonic() + timeout
    while True:
        missing = [t for t in trainers if not (result / f"trainer-{t}.json").exists()]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"Paddle trainers {missing} wrote no result within {timeout:g} s ({why}): "
                               f"see their logs")
        time.sleep(0.1)


def evaluate(exe, program, prob, data: Path) -> np.ndarray:
    """Forward only: the program pruned to ``prob`` keeps the sparse pull and drops every push."""
    dense, ids, _ = B.load_split(data, "test")
    test = program._prune(targets=[prob])
    out = []
    for s in range(0, len(dense), B.EVAL_BATCH):
        feed = {"dense": dense[s:s + B.EVAL_BATCH]}
        feed.update({f"C{f}": np.ascontiguousarray(ids[s:s + B.EVAL_BATCH, f:f + 1]) for f in range(B.FIELDS)})
        out.append(exe.run(test, feed=feed, fetch_list=[prob.name])[0].reshape(-1))
    return np.concatenate(out)


def dense_puller(fleet):
    """A call that copies the servers' current dense values into this trainer's scope: Paddle's own
    ``pull_dense_params``, as ``init_worker`` calls it. In async mode the trainer program only pushes
    dense gradients (a ``send`` op); with ``exe.run`` nothing brings the servers' values back (the
    device workers of ``train_from_dataset`` run a pull-dense thread for that), so the loop calls this
    after every step, and the chief once more before the evaluation."""
    from paddle.distributed.ps.utils.public import get_the_one_recv_context
    rt = fleet.fleet._runtime_handle                 # the Fleet instance behind the module's functions
    recv = get_the_one_recv_context(rt.context, split_dense_table=False)
    return lambda: rt._pull_all_dense(rt.scopes, rt._send_ctx, recv)


def write_result(result: Path, out: dict) -> None:
    path = result / f"trainer-{out['trainer_id']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, path)       # the driver and the chief never see half a file


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="one PaddlePaddle PS process (server or trainer) of the CTR model")
    p.add_argument("--data", required=True, help="directory of ps_vs_pytorch.py's .npy files")
    p.add_argument("--result", required=True, help="directory for trainer-<id>.json and probs-0.npy")
    p.add_argument("--init", required=True, help="directory of the dense initial weights (w0.npy, b0.npy, ...)")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--batches", type=int, required=True, help="batches of the whole epoch, over all trainers")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--wait-timeout", type=float, default=300.0, help="the chief's wait for the others, s")
    args = p.parse_args(argv)
    os.environ.setdefault("FLAGS_enable_pir_api", "0")     # the PS passes work on the legacy program IR
    import paddle
    import paddle.distributed.fleet as fleet
    paddle.enable_static()
    fleet.init()                                            # PaddleCloudRoleMaker from the environment
    loss, prob = build_program()
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    strategy.sparse_table_configs = table_configs()
    optimizer = fleet.distributed_optimizer(paddle.optimizer.Adam(learning_rate=B.DENSE_LR), strategy)
    optimizer.minimize(loss)

    if fleet.is_server():
        fleet.init_server()
        print(f"Paddle PS server {fleet.server_index()} of {fleet.server_num()} serving", flush=True)
        fleet.run_server()                                   # until the driver stops this process
        return 0

    tid, trainers = fleet.worker_index(), fleet.worker_num()
    data, result = Path(args.data), Path(args.result)
    dense, ids, labels = B.load_split(data, "train")
    mine = feeds(dense, ids, labels, args.batch, range(tid, args.batches, trainers))
    B.check_steps(len(mine), args.warmup)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    set_dense_init(Path(args.init))
    fleet.init_worker()                         # trainer 0 pushes its dense values, every trainer pulls them
    main_program = paddle.static.default_main_program()
    clock = B.SteadyClock(args.warmup)
    pull_dense = dense_puller(fleet)
    losses = []
    for feed in mine:
        losses.append(float(exe.run(main_program, feed=feed, fetch_list=[loss.name])[0]))
        pull_dense()
        clock.tick(len(feed["label"]))
    out = clock.result()
    out["train_loss"] = {"first": losses[0], "last": losses[-1]}     # a diagnostic in the result file
    fleet.get_fl_client().client_flush()            # this trainer's async pushes are on the servers
    out.update(trainer_id=tid, num_trainers=trainers, auc=None, logloss=None)
    if tid != 0:
        write_result(result, out)
        # Stay a client until the chief has evaluated: the servers must not see this trainer's stop first.
        wait_for(result, [0], args.wait_timeout, "the chief's evaluation")
        fleet.stop_worker()
        return 0
    wait_for(result, range(1, trainers), args.wait_timeout, "the chief evaluates after every trainer")
    pull_dense()
    probs = evaluate(exe, main_program, prob, data)
    np.save(result / "probs-0.npy", probs.astype(np.float32))
    out["probs_file"] = "probs-0.npy"
    write_result(result, out)
    fleet.stop_worker()
    return 0


if __name__ == "__main__":
    sys.exit(main())
