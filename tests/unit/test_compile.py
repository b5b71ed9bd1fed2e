"""`--compile`: the torch.compile'd model equals the eager one (outputs and gradients, fp32), on the padded and
the unpadded path, and falls back to eager execution when compilation fails. The equivalence runs on the
`aot_eager` backend; the one case on inductor (code generation) is marked slow."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from bert.errors import InputError
from bert.modeling import BertForPreTraining, BertForSequenceClassification
from bert.training import compile_model

TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def inductor():
    """Skip when torch.compile's default backend cannot build a kernel on this machine (e.g. no C++ compiler)."""
    torch._dynamo.reset()
    try:
        torch.compile(lambda x: x.sin() + 1)(torch.randn(3))
    except Exception as e:
        pytest.skip(f"torch.compile (inductor) does not work on this CPU: {type(e).__name__}: {e}")
    finally:
        torch._dynamo.reset()


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()  # a fresh code cache: no recompile limit carried over from other tests
    yield
    torch._dynamo.reset()


def _recording(compiler):
    """A backend that records every graph it compiles: proves the compiled model did not silently run eagerly."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return compiler(gm, example_inputs)

    return backend, graphs


def _batch(config, batch: int, seq: int, lengths: list[int], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(seq) < torch.tensor(lengths)[:, None]).long()  # [B, T]
    return {
        "input_ids": torch.randint(0, config.vocab_size, (batch, seq), generator=g) * mask,
        "attention_mask": mask,
        "token_type_ids": torch.randint(0, 2, (batch, seq), generator=g) * mask,
    }


def _run(name: str, model, batch: dict[str, torch.Tensor], seed: int):
    """Forward with labels, backward of the loss; returns (outputs to compare, loss, gradients by name)."""
    g = torch.Generator().manual_seed(seed)
    B = batch["input_ids"].shape[0]
    if name == "BertForPreTraining":
        P = 3
        positions = torch.stack([torch.randperm(3, generator=g) + 1 for _ in range(B)])  # [B, P], real tokens
        out = model(
            **batch,
            masked_lm_positions=positions,
            masked_lm_ids=torch.randint(0, model.config.vocab_size, (B, P), generator=g),
            masked_lm_weights=torch.tensor([[1.0, 1.0, 0.0]]).expand(B, P),
            next_sentence_labels=torch.randint(0, 2, (B,), generator=g),
        )
        outputs, loss = [out.mlm_logits, out.nsp_logits], out.total_loss
    else:
        out = model(**batch, labels=torch.randint(0, 3, (B,), generator=g))
        outputs, loss = [out.logits], out.loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return outputs, loss.detach(), grads


def _models(name: str, config):
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    config.num_hidden_layers = 1  # every kind of block once: compilation time grows with the graph
    torch.manual_seed(0)
    eager = BertForPreTraining(config) if name == "BertForPreTraining" else BertForSequenceClassification(config, 3)
    return eager.train(), copy.deepcopy(eager).train()


def _check_compiled_equals_eager(name: str, unpad: bool, config, compiler) -> None:
    backend, graphs = _recording(compiler)
    eager, compiled = _models(name, config)
    for m in (eager, compiled):
        m.set_unpad(unpad)
    assert compile_model(compiled, backend=backend) is compiled
    # Two batches of other lengths: the unpadded path sees another number of real tokens and recompiles.
    batches = [_batch(config, 4, 12, [12, 7, 5, 9], seed=1), _batch(config, 4, 12, [6, 12, 4, 11], seed=2)]
    for i, batch in enumerate(batches):
        expected, expected_loss, expected_grads = _run(name, eager, batch, seed=10 + i)
        got, loss, grads = _run(name, compiled, batch, seed=10 + i)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, **TOL)
        torch.testing.assert_close(loss, expected_loss, **TOL)
        assert grads.keys() == expected_grads.keys()
        for n in expected_grads:
            torch.testing.assert_close(grads[n], expected_grads[n], **TOL, msg=lambda m, n=n: f"{n}: {m}")
    assert graphs, "nothing was compiled: the model ran eagerly"
    assert compiled._compiled_call_impl is not None  # no fallback happened
    assert list(compiled.state_dict()) == list(eager.state_dict())  # the checkpoint keys stay


@pytest.mark.parametrize("unpad", [False, True], ids=["padded", "unpadded"])
@pytest.mark.parametrize("name", ["BertForPreTraining", "BertForSequenceClassification"])
def test_compiled_equals_eager(tiny_config, fresh_dynamo, name, unpad):
    """Dynamo's capture and AOTAutograd's forward and backward graphs (the `aot_eager` backend: everything
    --compile does but inductor's code generation, which costs tens of seconds per graph on a CPU)."""
    _check_compiled_equals_eager(name, unpad, tiny_config, torch._dynamo.lookup_backend("aot_eager"))


@pytest.mark.slow
def test_inductor_compiled_equals_eager(tiny_config, inductor, fresh_dynamo):
    """The default backend itself, with its generated kernels, on the path with the most graphs."""
    from torch._inductor.compile_fx import compile_fx  # inductor's entry point, loaded only by this slow test

    _check_compiled_equals_eager("BertForPreTraining", True, tiny_config, compile_fx)


def _failing_backend(gm, example_inputs):
    raise RuntimeError("no C++ compiler here")


def test_compile_failure_falls_back_to_eager(tiny_config, caplog):
    eager, compiled = _models("BertForSequenceClassification", tiny_config)
    compile_model(compiled, backend=_failing_backend)
    batch = _batch(tiny_config, 4, 12, [12, 7, 5, 9], seed=1)
    expected, expected_loss, expected_grads = _run("BertForSequenceClassification", eager, batch, seed=3)
    try:
        with caplog.at_level(logging.WARNING, logger="bert.pretrain"):
            got, loss, grads = _run("BertForSequenceClassification", compiled, batch, seed=3)
    finally:
        torch._dynamo.reset()
    assert "compilation failed" in caplog.text and "running eagerly" in caplog.text
    assert compiled._compiled_call_impl is None  # eager from now on: no further attempts
    torch.testing.assert_close(got[0], expected[0], **TOL)
    torch.testing.assert_close(loss, expected_loss, **TOL)
    for n in expected_grads:
        torch.testing.assert_close(grads[n], expected_grads[n], **TOL)


def test_compiled_model_raises_input_errors_unchanged(tiny_config, caplog):
    """A bad input is the caller's error, not a compilation failure: it is raised, and compilation stays on."""
    _, compiled = _models("BertForSequenceClassification", tiny_config)
    compile_model(compiled, backend="eager")  # dynamo's capture without code generation: fast
    too_long = torch.zeros(2, tiny_config.max_position_embeddings + 1, dtype=torch.long)
    try:
        with caplog.at_level(logging.WARNING, logger="bert.pretrain"), pytest.raises(InputError, match="exceeds"):
            compiled(too_long)
    finally:
        torch._dynamo.reset()
    assert "running eagerly" not in caplog.text
    assert compiled._compiled_call_impl is not None


@pytest.mark.parametrize("name", ["pretrain", "classify", "squad", "ner", "swag"])
def test_every_training_command_has_the_compile_flag(name):
    import argparse
    import dataclasses

    from bert import cli

    args_cls, _ = cli._resolve(name)
    flag = {f.name: f for f in dataclasses.fields(args_cls)}["compile"]
    assert flag.default is False and "eager fallback" in flag.metadata["help"]
    parser = argparse.ArgumentParser()
    cli.add_dataclass_flags(parser, args_cls)
    assert "--compile" in parser._option_string_actions
