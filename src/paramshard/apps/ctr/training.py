"""The CTR app's run: read, train epoch by epoch, validate, keep the best, report.

Every trainer reads its share of --train's training rows (rows t, t+T, ... of
those not held out), shuffled each epoch, the same number of steps on every
trainer; in an elastic job the shard service hands the rows out instead, and
trainers leave and join between steps (elastic.py). After each epoch all trainers meet at a barrier, trainer 0 scores the
model on the validation rows and on --test (exact AUC, log loss, accuracy; a
regression label: MSE, RMSE, MAE; several labels: per label and their mean) and
decides (selection.py): keep this epoch's model as the best, decay the learning
rates, or stop. The decision reaches every trainer through Trainer.broadcast, so
all of them take the same next step. At the end trainer 0 scores the best
epoch's model, restored from its snapshot, on --test: those are the run's final
figures, and --export writes that model.
"""
from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import paramshard as ps
from paramshard.trainer.epochs import start_at
from paramshard.data.features.batch import TabularBatch
from paramshard.data.features.fit import fit_schema
from paramshard.specs.schema import Schema
from paramshard.data.readers.tabular import TabularReader, count_records
from paramshard.data.shards.dynamic import DynamicShards
from paramshard.inference.evaluation import evaluate
from paramshard.models import build_model, hashed_embedding
from paramshard.models.heads import head_of
from paramshard.observe.report.server_table import StepProgress
from paramshard.apps.ctr import elastic, loss_check, refit, table_size
from paramshard.apps.ctr.audit import TrainedLog
from paramshard.apps.ctr.inputs import checked_schema
from paramshard.apps.ctr.result import result_record
from paramshard.apps.ctr.selection import Decision, settle_monitor

EVAL_BATCH = 8192
# The run's test figures in --json (a regression's: mse, rmse, mae, label_std; multi-task: "tasks" too).
RESULT_KEYS = ("auc", "gauc", "groups", "logloss", "accuracy", "mse", "rmse", "mae", "label_std", "rows", "tasks")
BEST_MODEL = "best-model.pt"       # the best epoch's model (inference/serving.py's format)


def load_schema(args, trainers: int, log) -> Schema:
    """The schema, every input file checked against it first (inputs.py), fitted on --train if
    it has no statistics yet."""
    schema = checked_schema(args, trainers)
    if schema.unfitted():
        log(f"schema {args.schema} has no statistics for {', '.join(schema.unfitted())}: fitting it on the "
            f"training files (run `paramshard schema fit` once to skip this)")
        schema = fit_schema(schema, args.train, skip_bad_lines=args.skip_bad_lines)
    settle_monitor(args, schema)
    return schema


def capacity_hint(schema: Schema) -> int:
    """Distinct ids the fitted data had: the tables reserve that many rows up front."""
    total = 0
    for c in schema.fields:
        stats = c.stats or {}
        total += stats.get("distinct", 0) + 2 if c.kind != "numeric" else c.bucketize + 1
    return total


def make_model(args, schema: Schema, has_servers: bool):
    rows = ps.optim.Adagrad(lr=args.table_lr, weight_decay=args.embedding_l2)
    if not has_servers:
        # Collective mode: hashed tables every trainer holds whole, trained with the same
        # Adagrad as the servers' tables (collective/allreduce_sync.py).
        tables = dict(embedding=hashed_embedding(args.buckets, optimizer=rows))
    else:
        tables = dict(table_optimizer=rows, capacity=capacity_hint(schema))
    return build_model(args.model, schema, **args.architecture, **tables)


class Run:
    """One training run of the app, on this trainer."""

    def __init__(self, args, env, say):
        self.args, self.env, self.say = args, env, say
        self.chief = env.trainer_id == 0
        self.elastic = elastic.is_elastic(env)
        self.steps = 0               # steps per epoch per trainer (elastic: if every trainer stays)
        self.trained = TrainedLog(args.trained_log, env.trainer_id) if args.trained_log else None
        self.history: dict[int, dict] = {}    # by epoch: an epoch run again (rollback) replaces its record
        self.warnings: list[str] = []
        self.hints: list[str] = []   # advice on a run that went well (not warnings)
        self.best_epoch: int | None = None
        self.lr_scale = 1.0          # the learning rates' factor so far (every decay on a plateau)
        self.decays: list[int] = []  # the epochs after which the rates decayed (what a refit repeats)
        self.stopped = False         # early stopping ended the run (a resume trains no further)
        self.workdir = self.best_file = None
        if self.chief and env.checkpoint_dir:
            # Beside the checkpoints: a resumed job still has the best epoch's model it found.
            self.best_file = Path(env.checkpoint_dir) / BEST_MODEL
        elif self.chief:
            self.workdir = Path(tempfile.mkdtemp(prefix="paramshard-ctr-"))
            self.best_file = self.workdir / BEST_MODEL

    # -- what a checkpoint keeps of the run (Trainer.state: saved with each, back on resume) ----------
    def remember(self, trainer) -> None:
        trainer.state["ctr"] = {"history": [self.history[e] for e in sorted(self.history)],
                                "best_epoch": self.best_epoch, "lr_scale": self.lr_scale, "warnings": self.warnings,
                                "decays": self.decays,
                                "stopped": self.stopped}

    def recall(self, trainer) -> None:
        saved = trainer.state.get("ctr")
        if not saved:
            return
        self.history = {int(r["epoch"]): r for r in saved.get("history", [])}
        self.best_epoch, self.lr_scale = saved.get("best_epoch"), float(saved.get("lr_scale", 1.0))
        self.warnings = list(saved.get("warnings", []))
        self.decays = [int(e) for e in saved.get("decays", [])]
        self.stopped = bool(saved.get("stopped", False))
        if self.history:
            self.say(f"resumed after epoch {max(self.history)}: its validation history, best epoch "
                     f"{self.best_epoch} and learning-rate factor {self.lr_scale:g} come from the checkpoint")

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        self.say(f"warning: {text}")

    # -- the data ------------------------------------------------------------
    def readers(self, schema: Schema, trainer):
        a, env = self.args, self.env
        holdout = elastic.holdout(a, self.elastic)
        train_side, side = training_side(a), getattr(a, "side", None)
        train: DynamicShards | TabularReader
        if self.elastic:
            train = elastic.train_loader(a, schema, holdout, trainer)
            self.steps = elastic.steps_estimate(a, schema, env)
        else:
            train = TabularReader(a.train, schema, a.batch_size, shard=(env.trainer_id, env.num_trainers),
                                  shuffle=True, seed=a.seed, equal_steps=True, skip_bad_lines=a.skip_bad_lines,
                                  holdout=holdout, side=train_side)
            self.steps = len(train)
        valid = None
        if self.chief and a.valid is not None:
            valid = TabularReader(a.valid, schema, EVAL_BATCH, skip_bad_lines=a.skip_bad_lines, side=side)
        elif self.chief and holdout is not None:
            valid = TabularReader(a.train, schema, EVAL_BATCH, skip_bad_lines=a.skip_bad_lines, holdout=holdout.other(),
                                  side=side)
        test = TabularReader(a.test, schema, EVAL_BATCH, skip_bad_lines=a.skip_bad_lines, side=side) \
            if self.chief else None
        return train, valid, test

    # -- an epoch --------------------------------------------------------------
    def train_epoch(self, trainer, model, reader, epoch: int) -> tuple[float, int]:
        progress = StepProgress(self.steps, f"epoch {epoch}") if self.chief else None
        losses, rows = [], 0
        head = head_of(model)
        # From where the job is in this epoch (a resume, a rollback): trainer.prefetching puts the
        # reader back at that batch (trainer/loop.py). An elastic trainer asked to leave: the loop
        # ends after the step that just ran (trainer/leave_request.py).
        for b in trainer.prefetching(reader, convert=TabularBatch.torch):
            if len(b["labels"]) == 0:
                trainer.step()          # sync, DynamicShards: no task left for now, the step still counts
                continue
            # --weight: each row's loss times its weight (PyTorch's weight=, Keras's sample_weight), averaged
            # over the batch's rows. BCE, a regression's MSE on the standardised label, or the mean of the
            # tasks' BCE (models/heads.py).
            loss = head.loss(model(b["dense"], b["ids"], b["offsets"], b["weights"]), b["labels"],
                             b.get("sample_weight"))
            trainer.step(loss)
            losses.append(loss.item())
            rows += len(b["labels"])
            if self.trained is not None:
                self.trained.add(b)
            if progress:
                progress.advance(f"loss {np.mean(losses[-50:]):.4f}")
        if progress:
            progress.close()
        if self.trained is not None:
            self.trained.epoch_done(epoch)
        if self.chief and not self.history:         # the run's first epoch
            trend = loss_check.loss_fell(losses)
            if trend is not None and not trend[0]:
                self.warn(f"the training loss did not fall over epoch {epoch} ({trend[1]:.4f} -> {trend[2]:.4f}): the "
                          f"model is not learning at these rates (lr {self.args.lr:g}, table lr "
                          f"{self.args.table_lr:g}); try ten times smaller or larger --lr and --table-lr")
        return float(np.mean(losses)) if losses else float("nan"), rows

    def after_epoch(self, trainer, model, epoch, train_loss, rows, seconds, valid, test) -> Decision:
        """Trainer 0: score the epoch's model, decide, keep it if it is the best."""
        a, trainers = self.args, self.env.num_trainers
        record = {"epoch": epoch, "train_loss": train_loss, "seconds": round(seconds, 3),
                  "samples_per_s": round(rows * trainers / seconds, 1), "lr_scale": self.lr_scale}
        scores = {}
        if valid is not None:
            scores = evaluate(model, valid)
            record["valid"] = scores
            if not self.history and "positive_rate" in scores and \
                    not loss_check.beats_the_base_rate(scores["logloss"], scores["positive_rate"]):
                self.warn(f"validation log loss {scores['logloss']:.4f} after epoch {epoch} is no better than always "
                          f"predicting the positive rate ({loss_check.base_rate_logloss(scores['positive_rate']):.4f}): "
                          f"check the learning rates (--lr, --table-lr) and the schema (`paramshard schema show`)")
            if not self.history and "rmse" in scores and not scores["rmse"] < scores["label_std"]:
                self.warn(f"validation RMSE {scores['rmse']:.4f} after epoch {epoch} is no better than always "
                          f"predicting the mean (the label's std, {scores['label_std']:.4f}): check the learning "
                          f"rates (--lr, --table-lr) and the schema (`paramshard schema show`)")
        record.update(evaluate(model, test))
        self.history[epoch] = record
        keys = ("rmse", "mae") if "rmse" in record else ("auc", "logloss")
        trainer.log(**{f"test_{k}": record[k] for k in keys}, **{f"valid_{k}": scores[k] for k in keys if scores})
        line = (f"epoch {epoch}: train loss {train_loss:.4f}  "
                + (f"valid {figures_text(scores)}  " if scores else "")
                + f"test {figures_text(record, accuracy=True)}  {rows * trainers / seconds:,.0f} samples/s")
        if scores:
            decision = a.selection.decide([self.history[e]["valid"][a.monitor] for e in sorted(self.history)])
            best = sorted(self.history)[decision.best_epoch]
            decision = Decision(best, decision.improved, decision.decay, decision.stop)
        else:       # nothing to choose with: the last epoch is the model
            decision = Decision(epoch, True, False, False)
        if decision.improved:
            line += "  (best so far)"
            snapshot(trainer, model, self.best_file)
            self.best_epoch = epoch
        self.say(line)
        self.check_overfitting()
        if decision.decay:
            self.say(f"  no better on validation for {a.lr_decay_after} epoch(s): learning rates x {a.lr_decay:g}")
        if decision.stop:
            self.say(f"  no better on validation for {a.patience} epoch(s) in a row: stopping; the best was epoch {decision.best_epoch}")
        return decision

    def check_overfitting(self) -> None:
        """Trainer 0, after an epoch's line: warn once a stretch of epochs overfits (loss_check.py)."""
        # A regression's validation MSE (its training loss is an MSE too), else the log loss.
        history = [(e, r["train_loss"], r["valid"]["mse"] if "mse" in r["valid"] else r["valid"]["logloss"])
                   for e, r in sorted(self.history.items()) if "valid" in r]
        stretch = loss_check.overfitting(history)
        if stretch is None:
            return
        first, last = (self.history[e] for e in stretch)
        key, name = ("mse", "MSE") if "mse" in first["valid"] else ("logloss", "log loss")
        self.warn(f"over epochs {stretch[0]}-{stretch[1]} the training loss fell ({first['train_loss']:.4f} -> "
                  f"{last['train_loss']:.4f}) while the validation {name} rose ({first['valid'][key]:.4f} -> "
                  f"{last['valid'][key]:.4f}): the model is overfitting (the best epoch's model is kept); try "
                  f"--embedding-l2 (e.g. 1e-5), fewer --epochs, or dropping an id-like column (one value per row, "
                  f"e.g. a row id: kind drop in the schema)")

    def hint_at_the_cap(self, decision: Decision | None, epoch: int | None) -> None:
        """Trainer 0: the run reached --epochs while its last epoch was still the best."""
        a = self.args
        if not self.chief or decision is None or decision.stop or not decision.improved or epoch != a.epochs:
            return
        if len(self.history) < 2 or not any("valid" in r for r in self.history.values()):
            return          # one epoch, or no validation: nothing says it is still improving
        self.hints.append(f"still improving at epoch {epoch} (validation {a.monitor} best so far): try --epochs "
                          f"{2 * a.epochs}")
        self.say(f"hint: {self.hints[-1]}")

    def finish(self, args, schema, trainers: int, servers: int) -> dict | None:
        """Trainer 0, after the last epoch: the best epoch's model, restored from its snapshot,
        scored on --test (the run's final figures) and exported."""
        if not self.chief or self.best_epoch is None:
            return None
        model = restore(self.best_file)
        final = evaluate(model, TabularReader(args.test, schema, EVAL_BATCH, skip_bad_lines=args.skip_bad_lines,
                                              side=getattr(args, "side", None)))
        self.say(f"best epoch {self.best_epoch}: test {figures_text(final, accuracy=True)} (its model restored from "
                 f"the snapshot)")
        if args.export and getattr(args, "refit_planned", False):
            self.say(f"--export {args.export}: the refit's model, once trained (refit.py)")
        elif args.export:
            Path(args.export).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.best_file, args.export)
            what = "the refit's model" if getattr(args, "is_refit", False) else "the best epoch's model"
            self.say(f"wrote {args.export}: {what} (`paramshard predict {args.export} DATA`)")
        return {"model": args.model, "trainers": trainers, "servers": servers, "mode": str(self.env.mode),
                "settings": {"lr": args.lr, "table_lr": args.table_lr, "batch_size": args.batch_size,
                             "embedding_l2": args.embedding_l2, **args.architecture,
                             "valid_fraction": None if args.valid else args.valid_fraction, "patience": args.patience,
                             "lr_decay": args.lr_decay, "lr_decay_after": args.lr_decay_after,
                             "weight": args.weight, "group_by": args.group_by, "epochs": args.epochs,
                             "lr_decay_at": args.lr_decay_at, "refit": args.refit,
                             "refit_planned": getattr(args, "refit_planned", False),
                             "holdouts": getattr(args, "holdouts", 1)},
                "lr_decays": self.decays,
                "epochs": [self.history[e] for e in sorted(self.history)], "best_epoch": self.best_epoch,
                "best": {k: final[k] for k in RESULT_KEYS if k in final},
                "final": {k: final[k] for k in RESULT_KEYS if k in final},
                "warnings": self.warnings, "hints": self.hints}

    def close(self) -> None:
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def gauc_text(scores: dict) -> str:
    """ " GAUC 0.7312" when the figures have one (--group-by), else nothing."""
    return f" GAUC {scores['gauc']:.4f}" if "gauc" in scores else ""


def figures_text(scores: dict, accuracy: bool = False) -> str:
    """An evaluation's figures for the epoch lines: "AUC 0.8 logloss 0.4 [accuracy 0.8]"; a
    regression's "RMSE 1.2 MSE 1.44 MAE 0.9"; a multi-task run's means, then each label's AUC."""
    if "rmse" in scores:
        return f"RMSE {scores['rmse']:.4f} MSE {scores['mse']:.4f} MAE {scores['mae']:.4f}"
    text = (f"{'mean ' if 'tasks' in scores else ''}AUC {scores['auc']:.4f}{gauc_text(scores)} logloss "
            f"{scores['logloss']:.4f}" + (f" accuracy {scores['accuracy']:.4f}" if accuracy else ""))
    if "tasks" in scores:
        text += " (" + ", ".join(f"{name} AUC {t['auc']:.4f}" for name, t in scores["tasks"].items()) + ")"
    return text


def training_side(args):
    """The side columns the training reader carries: the weight only (groups are for the metrics)."""
    from paramshard.data.features.side_columns import SideColumns
    side = getattr(args, "side", None)
    return SideColumns(weight=side.weight) if side is not None and side.weight else None


def snapshot(trainer, model, path: Path) -> None:
    """The model as it is now, in a model file (inference/serving.py's format): the best epoch's."""
    from paramshard.inference.serving import snapshot_model
    snapshot_model(trainer, path)


def restore(path: Path):
    """The snapshot as a model of its own, built from the architecture it records, its tables
    held in this process (what `paramshard predict` loads too)."""
    from paramshard.inference.serving import load_model
    return load_model(path)


def train(args, say) -> dict | None:
    env = ps.init()
    schema = load_schema(args, env.num_trainers, say)
    # Past SMALL_TABLE_ROWS every scaled default is the large table's: a big --train is not read through.
    rows = count_records(args.train, schema, up_to=table_size.SMALL_TABLE_ROWS) \
        if getattr(args, "scaled", None) or getattr(args, "refit", "never") == "auto" else 0
    scaled = table_size.settle(args, rows)
    if scaled:
        say(scaled)
    # After selection, a fresh model on all of --train (refit.py); standalone: no launcher's role.
    planned = refit.settle(args, rows, standalone=ps.runtime.environment().role is None)
    if planned:
        say(planned)
    elastic.refuse(args, env, schema)
    torch.manual_seed(args.seed)
    model = make_model(args, schema, env.mode.has_servers)
    trainer = ps.Trainer(model, optimizer=ps.optim.Adam(lr=args.lr))
    run = Run(args, env, say)
    run.recall(trainer)
    try:
        reader, valid, test = run.readers(schema, trainer)
        say(f"{describe_run(args, schema, env, run.steps)}")
        trainer.log(total_steps=run.steps * args.epochs)     # the launcher's progress shows an ETA
        ended = False           # a joiner: the job passed its first epoch's end already
        if env.joining:
            first, ended = elastic.joined_at(trainer)
            start_at(trainer, first)
            print(f"trainer {env.trainer_id} joined the running job at step {trainer.step_count}, epoch {first}"
                  f"{' (its end passed: waiting for trainer 0 decision)' if ended else ''}", flush=True)
        # Exact through rollbacks, --resume and restarts; a run early stopping ended stays ended.
        decision: Decision | None = None
        epoch: int | None = None
        for epoch in trainer.epochs(0 if run.stopped else args.epochs):
            trainer.log(epoch=epoch)
            start = time.perf_counter()
            train_loss, rows = (float("nan"), 0) if ended else run.train_epoch(trainer, model, reader, epoch)
            seconds = time.perf_counter() - start
            if trainer.leave_requested:
                break               # asked to leave: close now (the others go on without this trainer)
            if not ended:
                ps.barrier(elastic.END)         # every trainer's pushes of this epoch are in
            ended = False
            trainer.pull()                  # dense values as the servers hold them (async: others' pushes too)
            decision, wire = None, None
            if run.chief:
                wire = run.after_epoch(trainer, model, epoch, train_loss, rows, seconds, valid, test).to_json()
                bad = getattr(reader, "reader", reader)       # DynamicShards reads with a TabularReader
                if bad.bad_lines:
                    say(f"  skipped {bad.bad_lines} malformed lines, e.g. {bad.bad_line_examples[0]}")
            # Every trainer takes trainer 0's decision; nobody trains on while it reads the model.
            wire = trainer.broadcast(wire, name=elastic.SELECTION)
            if wire is None:
                continue        # rolled back past this point: trainer.epochs replays the epoch
            decision = Decision.from_json(wire)
            # --lr-decay-at: a fixed schedule (a refit's) instead of the decays on a plateau.
            if (decision.decay if args.lr_decay_at is None else epoch in args.lr_decay_at) and args.lr_decay < 1:
                if args.lr_decay_at is not None:
                    say(f"  learning rates x {args.lr_decay:g} after epoch {epoch} (--lr-decay-at)")
                trainer.scale_learning_rate(args.lr_decay)
                run.lr_scale *= args.lr_decay
                run.decays = [e for e in run.decays if e < epoch] + [epoch]     # a replayed epoch: once
            run.stopped = decision.stop
            run.remember(trainer)           # the next checkpoint (the next epoch's first, or close's) keeps it
            if decision.stop:
                break
        run.hint_at_the_cap(decision, epoch)
        out = run.finish(args, schema, env.num_trainers, len(env.servers))
        if out is not None:         # the run directory's result, which `paramshard report` says first
            trainer.log(result=result_record(out))
    finally:
        run.close()
    trainer.close()
    return out


def describe_run(args, schema, env, steps: int) -> str:
    from paramshard.apps.ctr.options import describe
    valid = (f"validation on {', '.join(args.valid)}" if args.valid else
             f"{args.valid_fraction:g} of --train held out for validation" if args.valid_fraction else "no validation")
    trainers = (f"{env.min_trainers} to {env.num_trainers} trainers (elastic: the shard service hands --train out), "
                f"about {steps}" if elastic.is_elastic(env) else f"{env.num_trainers} trainer(s), {steps}")
    return (f"{describe(args)}\n{schema.num_dense} dense features and {schema.num_fields} id fields; {trainers} "
            f"steps per trainer per epoch; {len(env.servers)} server(s), {env.mode} mode; {valid}; at most "
            f"{args.epochs} epochs (patience {args.patience}, learning rates x {args.lr_decay:g} after "
            + (f"epochs {','.join(map(str, args.lr_decay_at)) or 'none'} (--lr-decay-at)"
               if getattr(args, "lr_decay_at", None) is not None else
               f"{args.lr_decay_after} epoch(s) without improvement") + f", monitor {args.monitor})"
            + (f"; rows weighted by {args.weight!r}" if args.weight else "")
            + (f"; GAUC by {args.group_by!r}" if args.group_by else ""))


def write_json(path, out: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1, default=_jsonable) + "\n")


def _jsonable(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    return str(x)
