"""The CLI is a table of subcommands: every documented command exists, parses the original's flag
spellings, and reports bad command lines in one line with exit code 2."""

import dataclasses
import importlib.metadata
import json
import re
import resource
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from bert import cli
from conftest import REPO, cli_error


def test_every_command_is_documented_in_the_readme_and_back():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^### `bert ([a-z-]+)`", readme, flags=re.M))
    assert documented == set(cli.COMMANDS)


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_builds_its_parser_and_help(name, capsys):
    args_cls, run = cli._resolve(name)
    assert dataclasses.is_dataclass(args_cls) and callable(run)
    for f in dataclasses.fields(args_cls):
        assert f.metadata.get("help"), f"{name}: flag --{f.name} has no help text"
    with pytest.raises(SystemExit) as exc:
        cli.main([name, "--help"])
    assert exc.value.code == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"usage: bert {name} ")
    for f in dataclasses.fields(args_cls):
        if f.metadata.get("cli") is not False:
            shown = f.name.upper() if f.metadata.get("positional") else f.metadata.get("flag", f"--{f.name}")
            assert shown in printed, f"{name}: {shown} is not in --help"
    # An unset flag's help says what unset does; "(default: None)" would contradict it.
    assert "(default: None)" not in printed, f"{name}: --help shows (default: None)"


def test_help_through_the_module_entry_point():
    """`python -m bert CMD --help` in a process of its own (the in-process test above covers every command)."""
    result = subprocess.run([sys.executable, "-m", "bert", "squad", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("usage: bert squad ") and not result.stderr
    assert "--version_2_with_negative" in result.stdout


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_a_flag_error_costs_under_a_second_of_cpu(command):
    """The flags are parsed before torch or any heavy module loads (the command's module imports what it
    drives inside its run function): CPU time of the child process, so a busy machine does not make it
    flaky."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([sys.executable, "-m", "bert", command, "--no_such_flag=1"], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"bert {command}: error: unknown flag --no_such_flag"), result.stderr
    assert cpu < 1.0, f"bert {command}: a flag error took {cpu:.2f} s of CPU"


def test_importing_a_command_module_loads_no_torch():
    code = "import importlib, sys; from bert import cli; "
    code += "[importlib.import_module(m) for m, *_ in cli.COMMANDS.values()]; "
    code += "print(sorted(m for m in ('torch', 'bert.inference', 'bert.finetune') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "[]", result.stderr


def _flag_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:  # argparse's exit, as for any bad command line
        cli.main(list(argv))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    return err


def test_a_misspelled_flag_is_named_with_the_closest_real_one(capsys):
    line = _flag_error(capsys, "classify", "--task_nme=MRPC", "--data_dir=x", "--output_dir=y")
    assert line.startswith("bert classify: error: unknown flag --task_nme; did you mean --task_name")
    assert "required" not in line  # not the flag it was meant to be, reported missing
    assert "unknown flag --modle; did you mean --model?" in _flag_error(capsys, "embed", "--modle=x")


def test_a_misspelled_command_gets_did_you_mean(capsys):
    assert cli.main(["clasify", "--task_name=MRPC"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bert: error: unknown command 'clasify'; did you mean classify?") and err.count("\n") == 1
    assert cli.main(["fill_mask"]) == 2
    assert "did you mean fill-mask?" in capsys.readouterr().err


@dataclass
class _Args:
    name: str = field(metadata={"help": "a required string"})
    do_train: bool = field(default=False, metadata={"help": "a boolean"})
    do_lower_case: bool = field(default=True, metadata={"help": "a boolean, true by default"})
    rate: float = field(default=0.5, metadata={"help": "a float"})
    layers: str = field(default="-1", metadata={"help": "a list"})
    optional: str | None = field(default=None, metadata={"help": "optional"})


def _parse(argv):
    parser = cli._OneLineParser(prog="bert test")
    cli.add_dataclass_flags(parser, _Args)
    return _Args(**vars(parser.parse_args(cli._attach_negative_values(argv))))


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--name=x", "--do_train=true"], {"do_train": True}),
        (["--name", "x", "--do_train", "True"], {"do_train": True}),
        (["--name=x", "--do_train"], {"do_train": True}),
        (["--name=x", "--do_lower_case=false"], {"do_lower_case": False}),
        (["--name=x", "--nodo_lower_case"], {"do_lower_case": False}),
        (["--name=x", "--rate", "2e-5", "--layers", "-1,-2,-3"], {"rate": 2e-5, "layers": "-1,-2,-3"}),
        (["--name=x"], {"optional": None, "do_train": False, "do_lower_case": True}),
    ],
)
def test_flag_spellings(argv, expected):
    args = _parse(argv)
    for key, value in expected.items():
        assert getattr(args, key) == value


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--do_train=true"], "the following arguments are required: --name"),
        (["--name=x", "--do_train=maybe"], "expected true or false"),
        (["--name=x", "--rate=fast"], "invalid float value"),
        (["--name=x", "--unknown_flag=1"], "unrecognized arguments: --unknown_flag=1"),
    ],
)
def test_bad_command_lines_one_line_exit_2(capsys, argv, fragment):
    with pytest.raises(SystemExit) as exc:
        _parse(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_no_command_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "extract-features" in capsys.readouterr().out


# ------------------------------------------------------------------------------ one flag, one meaning
# Flags that two commands share but define differently, on purpose: which aspects differ, and why.
DIFFERENT_ON_PURPOSE = {
    "input_file": ({"help", "default"}, "what the input holds is the command's own: text, TFRecords, examples"),
    "output_file": ({"help", "default"}, "what the output holds is the command's own"),
    "train_file": ({"help", "default"}, "each task's file names, as its data set ships them"),
    "dev_file": ({"help", "default"}, "each task's file names, as its data set ships them"),
    "test_file": ({"help", "default"}, "each task's file names, as its data set ships them"),
    "labels": ({"help"}, "classify's generic labels are the training file's; ner's default is the CoNLL-2003 tags"),
    "do_predict": ({"help"}, "run_squad.py predicts answers to --predict_file, run_classifier.py the test set"),
    "vocab_file": ({"help", "default"}, "required where there is no checkpoint to find it beside"),
    "do_lower_case": ({"help", "default"}, "convert records the casing it is given, else keeps the input's"),
    "max_seq_length": (
        {"help", "default"},
        "run_squad.py's default is 384; predict/embed/fill-mask default to the model's",
    ),
    "long_document": ({"help", "default", "choices"}, "predict follows the model's config.json unless given"),
    "window_pooling": ({"help", "default", "choices"}, "predict follows the model's config.json unless given"),
    "output_format": (
        {"help", "default", "choices"},
        "pre-training data is written as TFRecords or native shards, search results as hits or rerank input",
    ),
    "precision": (
        {"help", "default", "choices"},
        "training's is the arithmetic (fp32, bf16, ...), embed's the number format of the vectors written",
    ),
    "doc_stride": ({"help", "default"}, "predict takes the stride the model was fine-tuned with"),
    "batch_size": (
        {"help", "default"},
        "extract-features keeps extract_features.py's help text and 32; the Predictor's default depends on the device",
    ),
    "model": (
        {"help", "default"},
        "each command needs another head: fine-tuned, any, masked-LM, exportable; index only records its digest",
    ),
    "top_k": ({"help", "default"}, "labels to list for predict, tokens per mask for fill-mask"),
    "output": ({"help"}, "convert writes a checkpoint directory, export a file"),
    "quantize": ({"help"}, "export quantizes the file it writes, with the runtime's own quantizer"),
    "format": ({"help", "default", "choices"}, "checkpoint formats for convert, runtimes for export"),
    "keep_checkpoint_max": ({"default"}, "fine-tuning checkpoints are resumption points; the model is exported"),
    "log_every": ({"default"}, "pre-training runs 100,000s of steps, fine-tuning hundreds"),
    "output_dir": (
        {"default", "help"},
        "quickstart runs with no flags at all; index writes an index, not a training run's directory",
    ),
    "loss": ({"help", "choices"}, "a bi-encoder and a cross-encoder train with different losses"),
    "normalize": (
        {"help"},
        "embed's default comes from the model it runs, train-embeddings' from the one it starts from",
    ),
    "optimizer": ({"default"}, "train-embeddings/train-reranker default to sentence-transformers' AdamW"),
    "weight_decay": ({"default"}, "train-embeddings/train-reranker default to sentence-transformers' 0.0"),
    "distill_alpha": (
        {"default"},
        "train-embeddings/train-reranker distil with sentence-transformers' losses: the teacher's outputs alone",
    ),
    "corpus_embeddings": ({"help", "default"}, "search embeds the corpus without them; index reads nothing else"),
    "seed": ({"help"}, "index draws its training sample with it, training runs initialise, order and drop out"),
    "chunk_size": (
        {"help", "default"},
        "search scores a chunk of the corpus at a time, index adds one; embed's are late chunking's tokens",
    ),
    "pooling": ({"help", "choices"}, "embed also offers the pre-training pooler, which training leaves untrained"),
}


def _flags_by_name() -> dict[str, dict[str, dict]]:
    """flag -> {command: {"help", "default", "choices"}} over every command of the table."""
    out: dict[str, dict[str, dict]] = {}
    for name in cli.COMMANDS:
        args_cls, _ = cli._resolve(name)
        for f in dataclasses.fields(args_cls):
            if f.metadata.get("cli") is False:
                continue
            default = f.default if f.default is not dataclasses.MISSING else "(required)"
            entry = {"help": f.metadata.get("help"), "default": default, "choices": f.metadata.get("choices")}
            out.setdefault(f.name, {})[name] = entry
    return out


def test_a_flag_shared_by_commands_has_one_help_text_and_one_default():
    shared = {flag: by_command for flag, by_command in _flags_by_name().items() if len(by_command) > 1}
    assert {"bert_config_file", "init_checkpoint", "vocab_file", "do_lower_case", "seed", "device"} <= set(shared)
    for flag, by_command in shared.items():
        differing = {
            aspect
            for aspect in ("help", "default", "choices")
            if len({repr(e[aspect]) for e in by_command.values()}) > 1
        }
        allowed, _reason = DIFFERENT_ON_PURPOSE.get(flag, (set(), ""))
        assert differing <= allowed, f"--{flag} differs in {differing - allowed} between {sorted(by_command)}"
    # Every listed difference is still real (a flag made consistent leaves the list).
    for flag, (allowed, _reason) in DIFFERENT_ON_PURPOSE.items():
        assert flag in shared, f"--{flag} is no longer shared"
        by_command = shared[flag]
        for aspect in allowed:
            assert len({repr(e[aspect]) for e in by_command.values()}) > 1, f"--{flag}: {aspect} no longer differs"


def test_every_model_building_command_takes_a_shape_name(tmp_path, capsys):
    """--bert_config_file=tiny wherever a model is built (vocab_size from the vocabulary); a path that does
    not exist says so."""
    import torch

    from bert.checkpoint import save_pretrained
    from bert.commands.classify import ClassifyArgs
    from bert.commands.convert import ConvertArgs, run_convert
    from bert.commands.extract_features import ExtractFeaturesArgs, run_extract_features
    from bert.config import named_config
    from bert.extract_features import demo_file
    from bert.modeling import BertForPreTraining
    from bert.starting_model import resolve_starting_model

    vocab = demo_file("vocab.txt")
    torch.manual_seed(0)
    weights = tmp_path / "tiny"  # BERT-Tiny's shape over the demo vocabulary, saved without its config
    save_pretrained(BertForPreTraining(named_config("tiny", vocab_size=99)), weights, vocab_file=vocab)
    (weights / "config.json").unlink()

    out = tmp_path / "features.jsonl"
    args = ExtractFeaturesArgs(output_file=str(out), init_checkpoint=str(weights), bert_config_file="tiny", layers="-1")
    assert run_extract_features(args)["examples"] == 5
    assert len(json.loads(out.read_text().splitlines()[0])["features"][0]["layers"][0]["values"]) == 128

    converted = tmp_path / "converted"
    run_convert(ConvertArgs(input=str(weights), output=str(converted), bert_config_file="tiny"))
    assert json.loads((converted / "config.json").read_text())["hidden_size"] == 128

    classify = ClassifyArgs(
        task_name="generic", data_dir=str(tmp_path), output_dir=str(tmp_path / "out"), init_checkpoint=str(weights)
    )
    for shape, hidden in (("tiny", 128), ("L-4_H-256", 256)):
        start = resolve_starting_model(dataclasses.replace(classify, bert_config_file=shape))
        assert (start.config.hidden_size, start.config.vocab_size) == (hidden, 99)

    assert "bert convert: done" in capsys.readouterr().err  # the result blocks of the runs above
    flags = [f"--data_dir={tmp_path}", f"--output_dir={tmp_path / 'out'}", f"--init_checkpoint={weights}"]
    err = cli_error(capsys, "classify", "--task_name=generic", "--do_train", "--bert_config_file=x/config.json", *flags)
    assert err.endswith(
        "--bert_config_file=x/config.json: no such file (nor a released shape's name such as tiny or base)"
    )
    assert "unknown model shape 'huge'" in cli_error(
        capsys, "classify", "--task_name=generic", "--do_train", "--bert_config_file=huge", *flags
    )


def test_verbose_and_version(tmp_path, capsys):
    from bert import __version__

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"bert {__version__}\n"
    out = tmp_path / "f.jsonl"
    # Default: the INFO log goes to the output's log file only; --verbose (before or after) adds the terminal.
    assert cli.main(["extract-features", f"--output_file={out}"]) == 0
    assert "INFO" not in capsys.readouterr().err
    assert "*** Example ***" in (tmp_path / "f.jsonl.log.txt").read_text()
    for argv in (
        ["--verbose", "extract-features", f"--output_file={out}"],
        ["extract-features", "--verbose", f"--output_file={out}"],
    ):
        assert cli.main(argv) == 0
        err = capsys.readouterr().err
        assert "INFO bert.extract_features: *** Example ***" in err
    # The terminal handler is removed when the command ends: nothing leaks into the next one.
    assert cli.main(["extract-features", f"--output_file={out}"]) == 0
    assert "INFO" not in capsys.readouterr().err


def test_env_names_versions_and_extras(capsys):
    import torch

    assert cli.main(["env"]) == 0
    lines = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines())
    assert lines["torch"].split()[0] == torch.__version__
    assert lines["threads"].split()[0] == str(torch.get_num_threads())
    assert {"bert", "python", "cpu", "cuda", "extra [plot]", "extra [corpus]"} <= set(lines)
    from bert import csrc

    # Which attention kernel inference runs: the compiled one where it is built, else torch's and why.
    assert lines["attention"].strip().startswith("bert.csrc's" if csrc.attention_kernel() else "torch's (")
    from bert.cpu_kernels import onednn_int8

    # Which int8 Linear --quantize=int8 runs: oneDNN's where it multiplies by VNNI, else torch's.
    assert lines["int8"].strip().startswith("oneDNN's" if onednn_int8() else "torch's")
    # Every extra of the package's own metadata, each installed or not (serve, onnx and minilm included).
    declared = importlib.metadata.metadata("bert").get_all("Provides-Extra")
    assert {"serve", "onnx", "minilm"} <= set(declared)
    for extra in declared:
        assert lines[f"extra [{extra}]"].split()[0] in ("installed", "not"), extra


def test_pretrain_takes_a_shape_name_or_the_config_and_vocab_beside_the_checkpoint(tmp_path):
    import torch

    from bert.checkpoint import save_pretrained
    from bert.commands.create_pretraining_data import CreatePretrainingDataArgs, run_create_pretraining_data
    from bert.commands.pretrain import PretrainArgs, run_pretrain
    from bert.config import named_config
    from bert.extract_features import demo_file
    from bert.modeling import BertForPreTraining
    from conftest import shared_path

    vocab = demo_file("vocab.txt")
    data = tmp_path / "data"
    text = shared_path("data", "sample_text.txt")
    run_create_pretraining_data(
        CreatePretrainingDataArgs(input_file=str(text), output_file=str(data), vocab_file=str(vocab), max_seq_length=32)
    )
    torch.manual_seed(0)
    weights = tmp_path / "tiny"
    save_pretrained(BertForPreTraining(named_config("tiny", vocab_size=99)), weights, vocab_file=vocab)
    flags = dict(input_file=str(data), max_seq_length=32, do_train=True, num_train_steps=1, train_batch_size=4)
    # No --bert_config_file, no --vocab_file: both from beside --init_checkpoint.
    run_pretrain(PretrainArgs(output_dir=str(tmp_path / "a"), init_checkpoint=str(weights), **flags))
    info = json.loads((tmp_path / "a" / "args.json").read_text())["args"]
    assert info["vocab_file"] == str(weights / "vocab.txt")
    assert json.loads((tmp_path / "a" / "model" / "config.json").read_text())["hidden_size"] == 128
    # A shape's name, with the vocab beside the checkpoint giving vocab_size.
    (weights / "config.json").unlink()
    run_pretrain(
        PretrainArgs(output_dir=str(tmp_path / "b"), init_checkpoint=str(weights), bert_config_file="tiny", **flags)
    )
    config = json.loads((tmp_path / "b" / "model" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (128, 2, 99)


@pytest.mark.parametrize("holds_group", [True, False])
def test_a_process_holding_a_process_group_ends_with_its_code_and_no_teardown(holds_group):
    """A torchrun worker that joined a process group ends in cli.main with its command's exit code and none of
    the interpreter's teardown (where destroying gloo's group can abort it); any other process ends normally."""
    script = (
        "import atexit, sys\n"
        "from bert import cli, distributed\n"
        "atexit.register(lambda: print('teardown ran', flush=True))\n"
        + ("distributed._PROCESS_GROUPS.append(object())\n" if holds_group else "")
        + "sys.exit(cli.main(['no-such-command']))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown command 'no-such-command'" in done.stderr
    assert ("teardown ran" in done.stdout) is not holds_group


def test_an_error_message_stays_one_line_when_a_file_name_holds_a_line_break(tmp_path, capsys):
    from conftest import uncased_vocab

    vocab = uncased_vocab(tmp_path)
    assert cli.main(["tokenize", f"--input_file={tmp_path}/no\nsuch.txt", f"--vocab_file={vocab}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no\\nsuch.txt" in err, err
