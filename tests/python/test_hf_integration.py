"""flamia as a transformers attention implementation (flamia.hf) on an sm_90 GPU.

A small randomly initialised LlamaForCausalLM (no downloaded weights) trains on packed documents:
its loss and gradients under attn_implementation="flamia" must agree with the same model under
transformers' own SDPA attention (which builds a block-diagonal causal mask from the position_ids
resets when use_cache=False). Both run under BF16 autocast, so only the attention differs.
Skips without torch, transformers or a Hopper GPU.
"""

import pytest

torch = pytest.importorskip("torch", reason="needs torch")
transformers = pytest.importorskip("transformers", reason="needs transformers")

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("flamia's kernels need an sm_90 GPU", allow_module_level=True)

import flamia.hf  # noqa: E402

DEVICE = "cuda"
LENS = [300, 1, 517, 206]  # one packed row of 1024 tokens, four documents
MIN_COSINE_GRAD = 0.997    # docs/DESIGN.md §4 bar, applied to the model's whole gradient
MIN_COSINE_PARAM = 0.99    # per parameter tensor (small tensors carry more relative noise)
MAX_LOSS_DIFF = 0.01

flamia.hf.register("flamia")
flamia.hf.register("flamia_prefix", isolation="prefix")


def make_model(attn, kv_heads=2, seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=64,
                                      max_position_embeddings=2048, attn_implementation=attn)
    return transformers.LlamaForCausalLM(config).to(DEVICE)


def packed_batch(lens, rows=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    length = sum(lens)
    ids = torch.randint(0, 256, (rows, length), generator=g)
    positions = torch.cat([torch.arange(n) for n in lens]).repeat(rows, 1)
    labels = ids.clone()
    labels[positions == 0] = -100  # no prediction across a document boundary
    return ids.to(DEVICE), positions.to(DEVICE), labels.to(DEVICE)


def loss_and_grads(model, ids, positions, labels, **kwargs):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, position_ids=positions, labels=labels, use_cache=False, **kwargs).loss
    loss.backward()
    return loss.detach().float(), {n: p.grad.detach().double().clone() for n, p in model.named_parameters()}


def cosine(a, b):
    return float((a @ b) / (a.norm() * b.norm()))


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("attn", ["flamia", "flamia_prefix"])
def test_loss_and_gradients_match_sdpa(attn, kv_heads):
    ids, positions, labels = packed_batch(LENS)
    reference = make_model("sdpa", kv_heads)
    model = make_model(attn, kv_heads)
    model.load_state_dict(reference.state_dict())
    ref_loss, ref_grads = loss_and_grads(reference, ids, positions, labels)
    loss, grads = loss_and_grads(model, ids, positions, labels)
    assert abs(loss.item() - ref_loss.item()) <= MAX_LOSS_DIFF, (loss.item(), ref_loss.item())
    flat = torch.cat([g.flatten() for g in grads.values()])
    ref_flat = torch.cat([ref_grads[n].flatten() for n in grads])
    assert cosine(flat, ref_flat) >= MIN_COSINE_GRAD
    for name, g in grads.items():
        assert torch.isfinite(g).all(), name
        assert cosine(g.flatten(), ref_grads[name].flatten()) >= MIN_COSINE_PARAM, name


def test_documents_do_not_see_each_other():
    # The packed row's loss on document 2 equals that document's loss alone: no attention across
    # boundaries (up to kernel rounding), and position_ids resets are honoured.
    model = make_model("flamia")
    ids, positions, labels = packed_batch(LENS)
    start, n = LENS[0] + LENS[1], LENS[2]
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        packed_logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0, start:start + n]
        alone_logits = model(input_ids=ids[:, start:start + n], position_ids=positions[:, start:start + n],
                             use_cache=False).logits[0]
    assert cosine(packed_logits.double().flatten(), alone_logits.double().flatten()) >= 0.9999


def test_boundaries_from_cu_seq_lens_match_position_ids():
    model = make_model("flamia")
    ids, positions, labels = packed_batch(LENS)
    cu = torch.tensor([0] + list(torch.tensor(LENS).cumsum(0)), dtype=torch.int32, device=DEVICE)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        by_positions = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        by_cu = model(input_ids=ids, position_ids=positions, use_cache=False, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                      max_length_q=max(LENS), max_length_k=max(LENS)).logits
    assert torch.equal(by_positions, by_cu)


def test_batch_rows_are_separate_documents():
    model = make_model("flamia")
    ids, positions, _ = packed_batch([512, 512], rows=2, seed=3)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        both = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        first = model(input_ids=ids[:1], position_ids=positions[:1], use_cache=False).logits
    # (not bitwise: the model's GEMMs may pick other algorithms for another batch size)
    assert cosine(both[:1].double().flatten(), first.double().flatten()) >= 0.9999


def test_padding_masks_and_kv_cache_are_refused():
    model = make_model("flamia")
    ids, positions, _ = packed_batch([64])
    mask = torch.ones_like(ids)
    mask[:, -5:] = 0
    with torch.no_grad(), pytest.raises(ValueError, match="attention_mask is not supported"):
        model(input_ids=ids, attention_mask=mask, use_cache=False)
    with torch.no_grad(), pytest.raises(ValueError, match="use_cache=False"):
        model.generate(ids, max_new_tokens=2, do_sample=False)
