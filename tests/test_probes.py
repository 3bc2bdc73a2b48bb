"""The probes: head diversity (linear CKA between heads), activation patching of the encoder, and the
one-line errors of every probe's command."""
import pytest
import torch

from probes.diversity import head_diversity, linear_cka


def test_identical_heads_have_zero_diversity():
    head = torch.randn(4, 1, 10, 8)
    same = head.expand(4, 3, 10, 8)
    res = head_diversity(same)
    assert res["diversity"] == pytest.approx(0.0, abs=1e-9)
    assert res["mean_cka"] == pytest.approx(1.0)
    different = torch.randn(4, 3, 10, 8)
    assert head_diversity(different)["diversity"] > 0.3


def test_cka_is_invariant_to_rotation_and_scale():
    x = torch.randn(50, 6, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))
    assert linear_cka(x, 3.0 * x @ q) == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["full", "fibottention", "lookhere"])
def test_activation_patching_reproduces_the_encoder_and_restoring_a_path_removes_its_change(kind):
    from policies.vision.attention import AttentionConfig
    from policies.vision.vit import ViT, ViTConfig
    from probes.feature_shift import relative_change
    from probes.shift_patching import components, run
    from tests.helpers import VIT_CROP

    torch.manual_seed(0)
    vit = ViT(ViTConfig(dim=32, depth=2, num_heads=4, attention=AttentionConfig(kind=kind)), VIT_CROP).eval()
    x = torch.rand(4, 3, 72, 72)
    f, clean = run(vit, x)
    torch.testing.assert_close(f, vit(x), rtol=1e-5, atol=1e-5)  # step by step is the encoder itself
    shifted = (x + 0.1).clamp(0, 1)
    f_shift, _ = run(vit, shifted)
    r0 = relative_change(f, f_shift)
    assert r0 > 1e-3
    restored = {label: relative_change(f, run(vit, shifted, clean, names)[0]) for label, names in components(vit)}
    # with CLS pooling the image reaches the output only through attention, and never through the last patch tokens
    assert restored["every block's attention"] < 1e-6 and restored["patch tokens after the last block"] == pytest.approx(r0)
    assert 0 < restored["block0.head1"] < r0 * 1.5 and restored["every block's MLP"] < r0


@pytest.mark.parametrize("module", ["feature_shift", "shift_patching", "action_shift", "vision_reliance"])
def test_the_encoder_analyses_end_a_bad_checkpoint_or_corruption_in_one_line(module, tmp_path, capsys):
    import importlib

    main = importlib.import_module(f"probes.{module}").main
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert "error: no checkpoint at" in err and "Traceback" not in err
    if module == "vision_reliance":  # it swaps images between windows: no corruption to give
        return
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--corruption", "bright"])
    assert "corruption='bright': give KIND:SEVERITY" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a dataset frame cannot be rendered again under another light
        main([str(tmp_path), "--corruption", "lighting:2"])
    err = capsys.readouterr().err
    assert "lighting:2: a scene shift is rendered by the simulator" in err and err.count("\n") == 1
