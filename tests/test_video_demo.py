"""The ``opforge demo detect`` demo and its command line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.video import read_frames, write_clip

# --- the demo -------------------------------------------------------------------------------------

RED = torch.tensor([255, 0, 0], dtype=torch.uint8).view(3, 1)


def check_drawn(png: str, frame_hwc: torch.Tensor) -> None:
    """The PNG is the frame with red box outlines drawn on it, nothing else changed."""
    from torchvision.io import read_image

    image = read_image(png)
    frame = frame_hwc.permute(2, 0, 1)
    assert image.shape == frame.shape and image.dtype == torch.uint8
    changed = (image != frame).any(dim=0)
    assert changed.sum() > 100  # boxes were drawn
    assert (image[:, changed] == RED).all()


@pytest.mark.slow
def test_demo_synthetic(tmp_path, capsys):
    pytest.importorskip("torchvision")
    from opforge.video import demo

    out = tmp_path / "out.png"
    assert demo.main(["--device", "cpu", "--frames", "8", "--batch", "4", "--save", str(out)]) == 0
    assert out.exists()
    check_drawn(str(out), torch.from_numpy(demo.synthetic_clip(8)[0]))
    text = capsys.readouterr().out
    assert "8 frames of (1080, 1920, 3) on cpu, batch 4" in text
    assert f"wrote {out}" in text


@pytest.mark.slow
def test_demo_video_file(tmp_path, capsys):
    pytest.importorskip("torchvision")
    pytest.importorskip("av")
    from opforge.video import demo

    path = str(tmp_path / "clip.mp4")
    write_clip(path, np.stack(demo.synthetic_clip(6, 180, 320, seed=int(torch.randint(0, 2**16, ())))))
    out = tmp_path / "out.png"
    assert demo.main([path, "--device", "cpu", "--frames", "5", "--batch", "4", "--save", str(out)]) == 0
    assert "5 frames of (180, 320, 3) on cpu" in capsys.readouterr().out
    check_drawn(str(out), next(read_frames(path, batch_size=1))[0])


def test_cli_demo_help(capsys):
    import opforge.cli

    with pytest.raises(SystemExit) as excinfo:
        opforge.cli.main(["demo", "detect", "--help"])
    assert excinfo.value.code == 0
    text = capsys.readouterr().out
    assert "opforge demo detect" in text and "--graph" in text and "--save" in text


def test_cli_demo_graph_needs_cuda(capsys):
    import opforge.cli

    assert opforge.cli.main(["demo", "detect", "--device", "cpu", "--graph"]) == 2
    assert "--graph needs a CUDA device" in capsys.readouterr().err
