"""`paramshard export-model`: a checkpoint -> one file a model loads without servers
(paramshard's model file), or runs without Python (--format torchscript|onnx)."""
from __future__ import annotations

HELP = ("write a checkpoint's trained model (dense parameters, sparse tables and the recorded model) to one "
        "file that paramshard.load_model and `paramshard predict` run without servers, or (--format "
        "torchscript|onnx) that serves it outside Python")
EXAMPLE = ("paramshard export-model runs/ckpt --out model.pt",
           "paramshard export-model runs/ckpt --format onnx --out model.onnx")
FORMATS = ("paramshard", "torchscript", "onnx")


def add_arguments(p) -> None:
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="a checkpoint directory (its latest checkpoint) or one step-NNNNNNNN directory in it; "
                        "with --format torchscript|onnx also a model file this command wrote")
    p.add_argument("--out", required=True, metavar="FILE", help="the file to write (replaced atomically)")
    p.add_argument("--format", choices=FORMATS, default="paramshard",
                   help="paramshard (default): the model file of `paramshard predict` and ps.load_model; "
                        "torchscript (torch.jit.load, C++ torch::jit::load) or onnx (onnxruntime): the model "
                        "with its tables inside, taking the encoded inputs (docs/serving.md) and giving the "
                        "scores predict gives")
    p.add_argument("--unknown", choices=("initial", "zeros"), default="initial",
                   help="with --format torchscript|onnx, what an id the tables do not hold reads: its "
                        "initial row as in predict (default), or zeros")


def describe_written(model: dict, out) -> str:
    rows = sum(len(t["ids"]) for t in model["sparse"].values())
    numbers = sum(t.numel() for t in model["dense"].values())
    spec = model.get("spec")
    built = f"; model {spec['model']} {spec['args']}" if spec else "; no recorded model (load it into your module)"
    return (f"wrote {out}: step {model['step']} of {model['checkpoint']}, {len(model['dense'])} dense "
            f"parameters ({numbers:,} numbers), {len(model['sparse'])} sparse tables ({rows:,} rows){built}")


def describe_portable(about: dict, fmt: str, out) -> str:
    shapes = ", ".join(f"{i['name']} {i['dtype']} [{', '.join(map(str, i['shape']))}]" for i in about["inputs"])
    score = about["outputs"][0]
    return (f"wrote {out} ({fmt}): model {about['model']} at step {about['step']}; inputs {shapes}; output score "
            f"float32 [{', '.join(map(str, score['shape']))}] ({score.get('meaning', 'the probability')}"
            f"{': ' + ', '.join(score['labels']) if len(score.get('labels', ())) > 1 else ''})")


def run(args) -> int:
    if args.format != "paramshard":
        from paramshard.inference.portable import export_portable      # torch: imported only when this runs
        print(describe_portable(export_portable(args.checkpoint, args.out, args.format, args.unknown),
                                args.format, args.out))
        return 0
    from paramshard.inference.serving import export_model    # torch: imported only when this command runs

    print(describe_written(export_model(args.checkpoint, args.out), args.out))
    return 0
