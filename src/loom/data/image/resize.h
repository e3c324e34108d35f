// Bicubic resampling of 8-bit RGB images that reproduces Pillow's Image.resize(..., BICUBIC) bit for
// bit, so images reach the vision tower exactly as the reference preprocessing delivers them.
#pragma once
#include "loom/data/image/image.h"

namespace loom::data {

// Resizes to out_height x out_width (both >= 1) with Pillow's separable bicubic convolution
// (a = -0.5, support widened by the downscale factor, 22-bit fixed-point weights), one pass per axis
// in Pillow 13's order (vertical first when the height shrinks by more than twice as many pixels as the
// width, horizontal first otherwise); a pass whose size is unchanged is skipped. Equal size returns a copy.
Image resize_bicubic(const Image& image, int out_height, int out_width);

}  // namespace loom::data
