// RS_TORCH_AT_LEAST(major, minor): compile-time check of the torch we build against,
// used to guard overrides of c10d virtuals that older torch versions do not declare.
#pragma once

#include <torch/version.h>

#define RS_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
