"""`paramshard export-model`: a checkpoint -> one file a model loads without servers."""
from __future__ import annotations

HELP = ("write a checkpoint's trained model (dense parameters, sparse tables and the recorded model) to one "
        "file that paramshard.load_model and `paramshard predict` run without servers")
EXAMPLE = "paramshard export-model runs/ckpt --out model.pt"


def add_arguments(p) -> None:
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="a checkpoint directory (its latest checkpoint) or one step-NNNNNNNN directory in it")
    p.add_argument("--out", required=True, metavar="FILE", help="the model file to write (replaced atomically)")


def describe_written(model: dict, out) -> str:
    rows = sum(len(t["ids"]) for t in model["sparse"].values())
    numbers = sum(t.numel() for t in model["dense"].values())
    spec = model.get("spec")
    built = f"; model {spec['model']} {spec['args']}" if spec else "; no recorded model (load it into your module)"
    return (f"wrote {out}: step {model['step']} of {model['checkpoint']}, {len(model['dense'])} dense "
            f"parameters ({numbers:,} numbers), {len(model['sparse'])} sparse tables ({rows:,} rows){built}")


def run(args) -> int:
    from paramshard.inference.serving import export_model    # torch: imported only when this command runs

    print(describe_written(export_model(args.checkpoint, args.out), args.out))
    return 0
