"""`--init_from_teacher_layers` in the commands that take a teacher only to start from its layers (swag;
squad, train-embeddings, train-reranker and pretrain also distil from it): the run starts from a student made of
those layers (`bert.distillation.student_from_teacher_layers`, wired in `bert.starting_model`)."""

from __future__ import annotations

import pytest
import torch

from bert.commands.pretrain import PretrainArgs, run_pretrain
from bert.distributed import DistContext
from bert.pretraining.evaluation import evaluate
from bert.pretraining.inputs import open_pretraining_data
from conftest import FIXTURES, cli_error, synthetic_data

TINY = FIXTURES / "tf_checkpoint" / "tiny"  # a 2-layer BertForPreTraining, TF checkpoint


def test_pretrain_starts_from_the_teachers_layers(tmp_path):
    from bert.checkpoint import read_checkpoint
    from bert.distillation import student_from_teacher_layers
    from bert.modeling import BertForPreTraining

    data, _ = synthetic_data(tmp_path, n=8, seq=32)
    teacher = str(TINY / "bert_model.ckpt")
    args = PretrainArgs(
        do_eval=True,
        input_file=str(data),
        output_dir=str(tmp_path / "run"),
        teacher=teacher,
        init_from_teacher_layers="1",
        max_seq_length=32,
        max_predictions_per_seq=5,
        eval_batch_size=4,
        max_eval_steps=2,
    )
    result = run_pretrain(args)
    ckpt = read_checkpoint(teacher)
    config, state = student_from_teacher_layers(ckpt.state_dict, ckpt.config, [1])
    assert config.num_hidden_layers == 1
    student = BertForPreTraining(config)
    student.load_state_dict({**student.state_dict(), **state})
    want = evaluate(student, open_pretraining_data(str(data), 32, 5, None), 4, 2, DistContext(torch.device("cpu")))
    assert result["eval"]["loss"] == pytest.approx(want["loss"], rel=1e-6)
    # Not the whole teacher's loss: the student really is one layer.
    full = BertForPreTraining.from_pretrained(teacher)
    whole = evaluate(full, open_pretraining_data(str(data), 32, 5, None), 4, 2, DistContext(torch.device("cpu")))
    assert whole["loss"] != pytest.approx(want["loss"], rel=1e-3)


# train-embeddings and train-reranker distil (--loss=mse, margin_mse, distill_kl; their refusal of a teacher with
# another loss is tests/e2e/test_distill_sentence.py's), pretrain distils from a teacher alone
# (tests/e2e/test_pretrain_distill.py), and so does squad (tests/e2e/test_distill_squad.py).
def test_a_teacher_alone_is_refused_where_the_command_does_not_distil(tmp_path, capsys):
    flags = [f"--output_dir={tmp_path / 'out'}", "--bert_config_file=tiny", f"--teacher={TINY}", "--data_dir=x"]
    error = cli_error(capsys, "swag", *flags, "--do_train")
    assert f"--teacher={TINY}: this command takes a teacher only to start from its layers" in error
    assert not (tmp_path / "out").exists()
