"""`bert evaluate-squad`: score SQuAD predictions with the official v1.1/v2.0 evaluation and print what
the official script prints (`bert.tasks.squad_evaluate`)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

from bert.errors import InputError
from bert.outputs import claim
from bert.tasks.squad_evaluate import check_na_probs, check_predictions, evaluate_v1, evaluate_v2
from bert.utils import atomic_write, load_json_file


@dataclass
class EvaluateSquadArgs:
    """Score SQuAD predictions with the official v1.1 or v2.0 evaluation and print what it prints."""

    dataset_file: str = field(
        metadata={"help": "SQuAD dataset JSON (e.g. dev-v1.1.json; .gz accepted)", "positional": True}
    )
    prediction_file: str = field(metadata={"help": "predictions JSON: {question id: answer text}", "positional": True})
    version: str | None = field(
        default=None,
        metadata={
            "help": 'evaluation to run; by default taken from the dataset\'s "version" field',
            "choices": ["1.1", "2.0"],
        },
    )
    na_prob_file: str | None = field(
        default=None,
        metadata={"help": "v2.0: JSON {question id: probability of no answer}", "flag": "--na-prob-file"},
    )
    na_prob_thresh: float = field(
        default=1.0,
        metadata={"help": "v2.0: predict no answer when the probability is above this", "flag": "--na-prob-thresh"},
    )
    out_file: str | None = field(
        default=None,
        metadata={"help": "write the metrics JSON to this file instead of printing them", "flag": "--out-file"},
    )


def _detect_version(dataset_json: dict, path: str) -> str:
    v = str(dataset_json.get("version", "")).lstrip("vV")
    if v.startswith("1."):
        return "1.1"
    if v.startswith("2."):
        return "2.0"
    raise InputError(
        f'{path}: no recognisable "version" field (got {dataset_json.get("version")!r}); '
        "pass --version 1.1 or --version 2.0"
    )


def run_evaluate_squad(args: EvaluateSquadArgs) -> dict:
    """Evaluate, then print the metrics as the official script does (or write them to --out-file)."""
    inputs: dict[str, str | None] = {"DATASET_FILE": args.dataset_file, "PREDICTION_FILE": args.prediction_file}
    inputs["--na-prob-file"] = args.na_prob_file
    with claim("evaluate-squad", files={"--out-file": args.out_file}, inputs=inputs):
        return _evaluate_squad(args)


def _evaluate_squad(args: EvaluateSquadArgs) -> dict:
    dataset_json = load_json_file(args.dataset_file, "dataset file")
    if not isinstance(dataset_json, dict) or "data" not in dataset_json:
        raise InputError(f'dataset file {args.dataset_file} has no "data" field; give a SQuAD dataset JSON')
    version = args.version or _detect_version(dataset_json, args.dataset_file)
    preds = check_predictions(load_json_file(args.prediction_file, "predictions file"), args.prediction_file)
    dataset = dataset_json["data"]
    try:
        if version == "1.1":
            if args.na_prob_file is not None:
                raise InputError("--na-prob-file is for SQuAD 2.0; drop it or pass --version 2.0")
            if dataset_json.get("version") != "1.1":
                print(
                    f"Evaluation expects v-1.1, but got dataset with v-{dataset_json.get('version')}",
                    file=sys.stderr,
                )
            result = evaluate_v1(dataset, preds, warn=lambda m: print(m, file=sys.stderr))
        else:
            na_probs = None
            if args.na_prob_file is not None:
                na_probs = check_na_probs(load_json_file(args.na_prob_file, "na_prob file"), args.na_prob_file)
            result = evaluate_v2(dataset, preds, na_probs, args.na_prob_thresh)
    except InputError as e:
        # Name the files behind the generic "dataset:"/"predictions:" prefixes.
        msg = str(e)
        for prefix, path in (
            ("dataset:", args.dataset_file),
            ("predictions:", args.prediction_file),
            ("na_probs:", args.na_prob_file),
        ):
            if msg.startswith(prefix):
                msg = f"{path}:{msg[len(prefix) :]}"
        raise InputError(msg) from None
    if args.out_file:
        with atomic_write(args.out_file) as f:
            json.dump(result, f)
    elif version == "1.1":
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return dict(result)
