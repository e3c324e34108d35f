#!/usr/bin/env python3
"""An independent judge of Moving Fashion-MNIST clips.

Loom's video job trains a text-to-video model on clips of one Fashion-MNIST item (28x28) sliding edge to
edge across a black canvas, captioned "a <class> moving <direction>". This script says, for a clip of
frames, which class the moving item looks like and which way it moves, and compares that with the
caption. It shares nothing with Loom but the definition of the data: the classifier is a small CNN
trained here with torch on Fashion-MNIST's training split, the real clips are synthesised here from the
t10k split, and the PNG frames are decoded here with zlib and numpy.

Run it with the project virtualenv's Python, .venv/bin/python3 (torch and numpy; nothing else;
`bash scripts/setup.sh --oracles` makes it). Modes:
  --real N        judge N real held-out clips made here: the accuracy that qualifies the judge
  --samples DIR   judge the clips of DIR/captions.json (frames in DIR/<name>/frame-*.png)
  --frames-dir D  judge one clip of PNG frames, against --caption if given
  --self-test     check the PNG reader on images written with each filter type
Each clip gets one human line; the last line is JSON:
  {"clips": N, "class_accuracy": x, "direction_accuracy": y, "both": z}

The parts: 1 data files and captions; 2 real clips; 3 PNG reader; 4 classifier; 5 judging a clip;
6 modes and command line; 7 self-test.
"""

import argparse
import glob
import gzip
import hashlib
import json
import os
import re
import struct
import sys
import time
import zlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------------
# Part 1: the data. Fashion-MNIST's IDX files and the captions' vocabulary.
# ---------------------------------------------------------------------------------------------------

SIDE = 28  # a Fashion-MNIST item is SIDE x SIDE grey pixels
CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat",
           "sandal", "shirt", "sneaker", "bag", "ankle boot"]  # by label, 0..9
DIRECTIONS = ["left", "right", "up", "down"]  # Loom's direction numbers 0..3
CAPTION = re.compile(r"^a (.+) moving (\w+)$")


def read_idx(path):
    """One gzipped IDX file: the images (N x 28 x 28 uint8) or the labels (N uint8)."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, count = struct.unpack(">II", data[:8])
    if magic == 2049:  # labels
        return np.frombuffer(data, np.uint8, count, 8)
    if magic == 2051:  # images
        rows, cols = struct.unpack(">II", data[8:16])
        return np.frombuffer(data, np.uint8, count * rows * cols, 16).reshape(count, rows, cols)
    raise ValueError(f"{path}: not an IDX file of images or labels (magic {magic})")


def load_split(data_dir, split):
    """The images and labels of one split, "train" (60000) or "t10k" (10000)."""
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    assert images.shape[1:] == (SIDE, SIDE) and len(images) == len(labels), (images.shape, labels.shape)
    return images, labels


def parse_caption(text):
    """The (class, direction) a caption names, each None where the caption does not name one."""
    match = CAPTION.match(text.strip().lower())
    if not match:
        return None, None
    name, direction = match.groups()
    return (name if name in CLASSES else None), (direction if direction in DIRECTIONS else None)

# ---------------------------------------------------------------------------------------------------
# Part 2: real clips, made here after Loom's definition (src/loom/data/synth/moving_fashion.cpp).
# ---------------------------------------------------------------------------------------------------


def check_geometry(canvas, frames):
    """Loom's limits: at least 2 frames, and the item moves at least 2 pixels a frame."""
    if frames < 2:
        raise SystemExit(f"a clip needs at least 2 frames, got {frames}")
    if canvas < SIDE + 2 * (frames - 1):
        raise SystemExit(f"a canvas of {canvas} is too small for {frames} frames "
                         f"(needs at least {SIDE + 2 * (frames - 1)})")


def make_clip(item, direction, across, canvas, frames):
    """A clip (frames x canvas x canvas x 3 uint8) of ITEM (28x28) moving DIRECTION (0..3) edge to edge.

    The offset along the motion goes from 0 to travel = canvas - 28, rounded to the nearest pixel as
    (travel * t + (frames - 1) // 2) // (frames - 1); left and up run it backwards. ACROSS (0..travel) is
    the crossing line. The grey item goes to all three channels of a black canvas.
    """
    travel = canvas - SIDE
    clip = np.zeros((frames, canvas, canvas, 3), np.uint8)
    for t in range(frames):
        along = (travel * t + (frames - 1) // 2) // (frames - 1)
        x, y = {0: (travel - along, across), 1: (along, across),
                2: (across, travel - along), 3: (across, along)}[direction]
        clip[t, y:y + SIDE, x:x + SIDE, :] = item[:, :, None]
    return clip


def real_clips(images, labels, count, canvas, frames, seed):
    """COUNT real clips from the given (held-out) items: yields (clip, class name, direction name).

    numpy's generator, seeded with SEED, picks the items (without repetition while there are enough),
    each clip's direction (uniform over the four) and its crossing line (uniform over 0..travel).
    """
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(images), size=count, replace=count > len(images))
    directions = rng.integers(0, len(DIRECTIONS), size=count)
    acrosses = rng.integers(0, canvas - SIDE + 1, size=count)
    for item, direction, across in zip(picks, directions, acrosses):
        clip = make_clip(images[item], int(direction), int(across), canvas, frames)
        yield clip, CLASSES[labels[item]], DIRECTIONS[direction]

# ---------------------------------------------------------------------------------------------------
# Part 3: a PNG reader with zlib and numpy: 8-bit grey (0), RGB (2), grey+alpha (4), RGBA (6), not
# interlaced, filters 0-4. That covers what Loom writes (libpng's simplified API, 8-bit RGB).
# ---------------------------------------------------------------------------------------------------

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # colour type -> samples a pixel


def _average_row(line, prior, bpp):
    """Undo filter 3: each byte adds the floor of the mean of the byte to its left and the one above."""
    out = bytearray(len(line))
    for i in range(len(line)):
        left = out[i - bpp] if i >= bpp else 0
        out[i] = (line[i] + ((left + prior[i]) >> 1)) & 0xFF
    return out


def _paeth_row(line, prior, bpp):
    """Undo filter 4: each byte adds whichever of left, above, upper-left is nearest left + above - upper-left."""
    out = bytearray(len(line))
    for i in range(len(line)):
        a = out[i - bpp] if i >= bpp else 0
        b = prior[i]
        c = prior[i - bpp] if i >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        nearest = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        out[i] = (line[i] + nearest) & 0xFF
    return out


def unfilter(raw, height, stride, bpp):
    """The image bytes (height x stride) from the decompressed scanlines, each led by its filter type."""
    rows = np.frombuffer(raw, np.uint8).reshape(height, stride + 1)
    out = np.empty((height, stride), np.uint8)
    prior = np.zeros(stride, np.uint8)  # the line above the first counts as zeros
    for y in range(height):
        kind, line = rows[y, 0], rows[y, 1:]
        if kind == 0:  # none
            row = line
        elif kind == 1:  # sub: a running sum along each channel
            row = (np.cumsum(line.reshape(-1, bpp), axis=0, dtype=np.int64) & 0xFF).astype(np.uint8).ravel()
        elif kind == 2:  # up
            row = line + prior  # uint8 arithmetic wraps modulo 256
        elif kind == 3:
            row = np.frombuffer(_average_row(line.tobytes(), prior.tobytes(), bpp), np.uint8)
        elif kind == 4:
            row = np.frombuffer(_paeth_row(line.tobytes(), prior.tobytes(), bpp), np.uint8)
        else:
            raise ValueError(f"unknown PNG filter type {kind} on line {y}")
        out[y] = row
        prior = out[y]
    return out


def read_png(path):
    """An 8-bit PNG file as an H x W x 3 uint8 RGB array (grey copied to the three channels, alpha dropped)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != PNG_SIGNATURE:
        raise ValueError(f"{path}: not a PNG file")
    pos, header, idat = 8, None, []
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            raise ValueError(f"{path}: bad CRC in chunk {kind!r}")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + length
    if header is None:
        raise ValueError(f"{path}: no IHDR chunk")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in PNG_CHANNELS or interlace != 0:
        raise ValueError(f"{path}: unsupported PNG (bit depth {depth}, colour type {colour}, "
                         f"interlace {interlace}); this reader takes 8-bit grey/RGB(A), not interlaced")
    channels = PNG_CHANNELS[colour]
    pixels = unfilter(zlib.decompress(b"".join(idat)), height, width * channels, channels)
    pixels = pixels.reshape(height, width, channels)
    rgb = pixels[:, :, :1 if channels < 3 else 3]  # drop the alpha
    return np.ascontiguousarray(np.broadcast_to(rgb, (height, width, 3)))


def read_frames(directory):
    """The clip in DIRECTORY's frame-*.png files, in name order: T x H x W x 3 uint8."""
    paths = sorted(glob.glob(os.path.join(directory, "frame-*.png")))
    if not paths:
        raise ValueError(f"{directory}: no frame-*.png files")
    frames = [read_png(p) for p in paths]
    if len({f.shape for f in frames}) != 1:
        raise ValueError(f"{directory}: the frames differ in size")
    return np.stack(frames)

# ---------------------------------------------------------------------------------------------------
# Part 4: the classifier. A small CNN on 28x28 windows placed on the item (Part 5's locate), trained
# on Fashion-MNIST's training split with the windows jittered by a pixel, and cached with a hash of the
# settings it was trained with.
# ---------------------------------------------------------------------------------------------------

TRAINING = {"net": "conv5s2-32/conv3s2-64/fc128/v1", "window": "quantile-extent/v1", "epochs": 10,
            "batch": 128, "lr": 2e-3, "jitter": 1, "seed": 1}


class FashionNet(nn.Module):
    """Two strided convolutions (28 -> 14 -> 7) and two linear layers: 10 class logits from a window."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, stride=2, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 3, stride=2, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, len(CLASSES))

    def forward(self, windows):  # windows: N x 28 x 28 floats in 0..1
        x = F.relu(self.conv1(windows.unsqueeze(1)))
        x = F.relu(self.conv2(x))
        x = F.dropout(x.flatten(1), 0.25, self.training)
        return self.fc2(F.relu(self.fc1(x)))


def predict(model, windows):
    """Softmax over the classes for N windows (N x 28 x 28, grey levels 0..255)."""
    model.eval()
    with torch.no_grad():
        return F.softmax(model(torch.from_numpy(np.asarray(windows, np.float32) / 255.0)), dim=1).numpy()


def train(data_dir, log):
    """Train a FashionNet on the training split; returns it and its accuracy on the t10k items."""
    torch.manual_seed(TRAINING["seed"])
    rng = np.random.default_rng(TRAINING["seed"])
    images, labels = load_split(data_dir, "train")
    origins = locate(images.astype(np.float32))
    targets = torch.from_numpy(labels.astype(np.int64))
    model = FashionNet()
    steps = TRAINING["epochs"] * (len(images) // TRAINING["batch"])
    optimiser = torch.optim.Adam(model.parameters(), lr=TRAINING["lr"])
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, TRAINING["lr"], total_steps=steps)
    for epoch in range(TRAINING["epochs"]):
        start, jitter = time.time(), TRAINING["jitter"]
        shifted = origins + rng.integers(-jitter, jitter + 1, size=origins.shape)
        windows = torch.from_numpy(crop(images, shifted).astype(np.float32) / 255.0)
        order = torch.from_numpy(rng.permutation(len(images)))
        model.train()
        total = 0.0
        for b in range(len(images) // TRAINING["batch"]):
            batch = order[b * TRAINING["batch"]:(b + 1) * TRAINING["batch"]]
            loss = F.cross_entropy(model(windows[batch]), targets[batch])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
            total += loss.item()
        log(f"classifier: epoch {epoch + 1}/{TRAINING['epochs']}: loss {total / (b + 1):.4f} "
            f"({time.time() - start:.1f} s)")
    test_images, test_labels = load_split(data_dir, "t10k")
    windows = crop(test_images, locate(test_images.astype(np.float32)))
    accuracy = float((predict(model, windows).argmax(1) == test_labels).mean())
    return model, accuracy


def load_classifier(cache, data_dir, log):
    """The classifier from CACHE if it was trained with these settings, else trained now and cached."""
    settings = dict(TRAINING, noise_floor=NOISE_FLOOR, extent_quantile=EXTENT_QUANTILE)  # all that shapes it
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    if os.path.exists(cache):
        saved = torch.load(cache, map_location="cpu", weights_only=True)  # tensors, numbers, strings
        if saved.get("settings_hash") == digest:
            model = FashionNet()
            model.load_state_dict(saved["state"])
            log(f"classifier: {cache} (t10k accuracy {saved['test_accuracy']:.4f})")
            return model, saved["test_accuracy"]
        log(f"classifier: {cache} was trained with other settings; training again")
    start = time.time()
    model, accuracy = train(data_dir, log)
    log(f"classifier: t10k accuracy {accuracy:.4f}, trained in {time.time() - start:.0f} s; saved to {cache}")
    os.makedirs(os.path.dirname(os.path.abspath(cache)), exist_ok=True)
    torch.save({"settings_hash": digest, "settings": settings, "state": model.state_dict(),
                "test_accuracy": accuracy}, cache + ".tmp")
    os.replace(cache + ".tmp", cache)
    return model, accuracy

# ---------------------------------------------------------------------------------------------------
# Part 5: judging a clip. The item's place in each frame comes from its grey mass (mean of RGB, less
# the frame's background level, faint pixels zeroed): the intensity-weighted centroid gives the motion,
# and the middle of the mass's extent places the 28x28 window that the classifier reads.
# ---------------------------------------------------------------------------------------------------

NOISE_FLOOR = 24.0  # grey levels above the background below which a pixel does not count as the item
EXTENT_QUANTILE = 0.02  # the extent of an item runs from this quantile of its mass to 1 - this
MIN_SHIFT = 0.25  # moving less than this fraction of the travel (canvas - 28) counts as "none"
MIN_PIXELS = 20  # a frame with fewer item pixels is blank (every Fashion-MNIST item has more than 30)


def foreground(frames):
    """Grey levels (T x H x W floats) above each frame's background level (its median grey)."""
    grey = frames.astype(np.float32).mean(axis=3)
    return np.maximum(grey - np.median(grey, axis=(1, 2), keepdims=True), 0.0)


def mass(grey):
    """The grey levels that count as the item: those under NOISE_FLOOR set to zero."""
    return np.where(grey >= NOISE_FLOOR, grey, 0.0)


def locate(grey):
    """For N grey images (N x H x W): the top-left corners (N x 2, row and column) of the 28x28 windows
    centred on the items, each the middle of the item's mass extent along rows and along columns."""
    weights = mass(grey)
    corners = []
    for axis in (2, 1):  # summing over columns gives the profile along rows, and back
        profile = np.cumsum(weights.sum(axis=axis), axis=1)
        total = np.maximum(profile[:, -1:], 1e-6)
        lo = (profile < EXTENT_QUANTILE * total).sum(axis=1)
        hi = (profile < (1 - EXTENT_QUANTILE) * total).sum(axis=1)
        corners.append(np.floor((lo + hi) / 2.0 - (SIDE - 1) / 2.0 + 0.5).astype(np.int64))
    return np.stack(corners, axis=1)


def crop(grey, corners, chunk=4096):
    """The 28x28 windows (N x 28 x 28, grey's type) at CORNERS of N images; outside the images is black."""
    n, height, width = grey.shape
    pad = int(max(0, -corners.min(), corners[:, 0].max() + SIDE - height, corners[:, 1].max() + SIDE - width))
    offsets = np.arange(SIDE)
    out = np.empty((n, SIDE, SIDE), grey.dtype)
    for s in range(0, n, chunk):
        padded = np.pad(grey[s:s + chunk], ((0, 0), (pad, pad), (pad, pad)))
        rows = corners[s:s + chunk, 0, None] + pad + offsets
        cols = corners[s:s + chunk, 1, None] + pad + offsets
        out[s:s + chunk] = padded[np.arange(len(padded))[:, None, None], rows[:, :, None], cols[:, None, :]]
    return out


def centroid(grey):
    """The intensity-weighted centroid (row, column) of one image's item mass, or None for a blank one."""
    weights = mass(grey)
    total = weights.sum()
    if (weights > 0).sum() < MIN_PIXELS:
        return None
    rows, cols = np.indices(grey.shape)
    return (weights * rows).sum() / total, (weights * cols).sum() / total


def judge_clip(frames, model):
    """Judge one clip (T x H x W x 3 uint8): the class the item looks like and where it moves.

    Returns {"class", "confidence", "direction", "dx", "dy"} (dx, dy: the centroid's move in pixels, None
    when the first or last frame is blank): the class with the highest softmax averaged
    over the windows of the frames that are not blank ("none" if all are), and the direction of the
    centroid's larger move from the first frame to the last ("none" for a move under MIN_SHIFT of the
    travel, or a blank first or last frame).
    """
    grey = foreground(frames)
    judged = {"class": "none", "confidence": 0.0, "direction": "none", "dx": None, "dy": None}
    seen = grey[(mass(grey) > 0).sum(axis=(1, 2)) >= MIN_PIXELS]
    if len(seen):
        probabilities = predict(model, crop(seen, locate(seen))).mean(axis=0)
        judged["class"], judged["confidence"] = CLASSES[int(probabilities.argmax())], float(probabilities.max())
    first, last = centroid(grey[0]), centroid(grey[-1])
    if first is not None and last is not None:
        dy, dx = last[0] - first[0], last[1] - first[1]
        judged["dx"], judged["dy"] = float(dx), float(dy)
        least = max(1.0, MIN_SHIFT * (min(grey.shape[1:]) - SIDE))
        if max(abs(dx), abs(dy)) >= least:
            if abs(dx) >= abs(dy):
                judged["direction"] = "right" if dx > 0 else "left"
            else:
                judged["direction"] = "down" if dy > 0 else "up"
    return judged

# ---------------------------------------------------------------------------------------------------
# Part 6: the modes and the command line. Each clip is compared with its expected class and direction.
# ---------------------------------------------------------------------------------------------------


def describe(judged):
    """The judgement in words: 'bag (0.97) moving left (dx -20.0, dy +0.0)'."""
    if judged["dx"] is None:
        move = "first or last frame blank"
    else:
        move = f"dx {judged['dx']:+.1f}, dy {judged['dy']:+.1f}"
    return f"{judged['class']} ({judged['confidence']:.2f}) moving {judged['direction']} ({move})"


class Tally:
    """Counts the clips and how many had the class, the direction and both right; prints their lines."""

    def __init__(self, quiet=False):
        self.clips = self.classes = self.directions = self.both = 0
        self.quiet = quiet

    def add(self, name, judged, want_class, want_direction, caption=None):
        class_ok, direction_ok = judged["class"] == want_class, judged["direction"] == want_direction
        self.clips += 1
        self.classes += class_ok
        self.directions += direction_ok
        self.both += class_ok and direction_ok
        if not self.quiet:
            said = f'"{caption}"' if caption is not None else f"{want_class} moving {want_direction}"
            print(f"{name}: {said} -> judged {describe(judged)}: "
                  f"class {'ok' if class_ok else 'WRONG'}, direction {'ok' if direction_ok else 'WRONG'}",
                  flush=True)

    def summary(self):
        """The final JSON line's object; accuracies are null when there were no clips."""
        def rate(hits):
            return round(hits / self.clips, 4) if self.clips else None
        return {"clips": self.clips, "class_accuracy": rate(self.classes),
                "direction_accuracy": rate(self.directions), "both": rate(self.both)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--real", type=int, metavar="N", help="judge N real held-out clips made from t10k")
    mode.add_argument("--samples", metavar="DIR", help="judge the clips listed in DIR/captions.json")
    mode.add_argument("--frames-dir", metavar="DIR", help="judge the clip of DIR/frame-*.png")
    mode.add_argument("--self-test", action="store_true", help="check the PNG reader and exit")
    parser.add_argument("--caption", help="the caption of --frames-dir's clip")
    parser.add_argument("--canvas", type=int, default=48, help="--real: canvas side (default 48)")
    parser.add_argument("--frames", type=int, default=9, help="--real: frames a clip (default 9)")
    parser.add_argument("--seed", type=int, default=0, help="--real: seed of the clips' draws (default 0)")
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="Fashion-MNIST's IDX files")
    parser.add_argument("--cache", default=os.path.expanduser("~/.cache/loom-judge/fashion_cnn.pt"),
                        help="the trained classifier's file (default ~/.cache/loom-judge/fashion_cnn.pt)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: the net is small; more only help on idle cores)")
    parser.add_argument("--quiet", action="store_true", help="no line per clip, only the totals")
    args = parser.parse_args()
    torch.set_num_threads(max(1, args.threads))
    if args.self_test:
        return self_test()

    def log(text):
        print(text, file=sys.stderr, flush=True)

    if args.real is not None:
        check_geometry(args.canvas, args.frames)
    model, _ = load_classifier(args.cache, args.data, log)
    tally, start = Tally(args.quiet), time.time()
    if args.real is not None:
        images, labels = load_split(args.data, "t10k")
        clips = real_clips(images, labels, args.real, args.canvas, args.frames, args.seed)
        for i, (clip, name, direction) in enumerate(clips):
            tally.add(f"real-{i:05d}", judge_clip(clip, model), name, direction)
    elif args.samples is not None:
        with open(os.path.join(args.samples, "captions.json")) as f:
            listed = json.load(f)
        for entry in listed:
            frames = read_frames(os.path.join(args.samples, entry["name"]))
            tally.add(entry["name"], judge_clip(frames, model), *parse_caption(entry["caption"]), entry["caption"])
    else:
        judged = judge_clip(read_frames(args.frames_dir), model)
        if args.caption is not None:
            tally.add(args.frames_dir, judged, *parse_caption(args.caption), args.caption)
        else:  # nothing to compare with: the judgement alone
            print(f"{args.frames_dir}: judged {describe(judged)}")
            print(json.dumps({"clips": 1, "class_accuracy": None, "direction_accuracy": None, "both": None,
                              "class": judged["class"], "direction": judged["direction"]}))
            return 0
    log(f"judged {tally.clips} clips in {time.time() - start:.1f} s")
    print(json.dumps(tally.summary()))
    return 0

# ---------------------------------------------------------------------------------------------------
# Part 7: the PNG reader's self-test. A small encoder writes random grey and RGB images with each filter
# type (the filter chosen line by line), and the reader must give the pixels back.
# ---------------------------------------------------------------------------------------------------


def _filter_line(kind, line, prior, bpp):
    """Filter one line of bytes (ints) with filter KIND against the original line above it."""
    left = np.concatenate([np.zeros(bpp, np.int64), line[:-bpp]])
    upper_left = np.concatenate([np.zeros(bpp, np.int64), prior[:-bpp]])
    p = left + prior - upper_left
    pa, pb, pc = np.abs(p - left), np.abs(p - prior), np.abs(p - upper_left)
    paeth = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prior, upper_left))
    predicted = [0 * line, left, prior, (left + prior) // 2, paeth][kind]
    return ((line - predicted) & 0xFF).astype(np.uint8)


def write_test_png(path, pixels, kinds):
    """Write PIXELS (H x W grey or H x W x 3 RGB uint8) as a PNG, line y filtered with kinds[y]."""
    height, width = pixels.shape[:2]
    bpp = 1 if pixels.ndim == 2 else 3
    lines = pixels.reshape(height, width * bpp).astype(np.int64)
    raw = b"".join(bytes([k]) + _filter_line(k, lines[y], lines[y - 1] if y else 0 * lines[0], bpp).tobytes()
                   for y, k in enumerate(kinds))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", width, height, 8, 0 if bpp == 1 else 2, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(PNG_SIGNATURE + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def self_test():
    """Round-trip random images through write_test_png and read_png; prints the JSON verdict."""
    import tempfile
    rng = np.random.default_rng(7)
    checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "test.png")
        for shape in [(13, 17), (13, 17, 3), (48, 48, 3), (1, 1, 3)]:
            mixed = [int(k) for k in rng.integers(0, 5, size=shape[0])]
            for kinds in [[k] * shape[0] for k in range(5)] + [mixed]:
                pixels = rng.integers(0, 256, size=shape, dtype=np.uint8)
                write_test_png(path, pixels, kinds)
                got = read_png(path)
                want = pixels if pixels.ndim == 3 else np.repeat(pixels[:, :, None], 3, axis=2)
                assert got.shape == want.shape and (got == want).all(), (shape, kinds)
                checked += 1
    print(json.dumps({"png_self_test": "ok", "images": checked}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
