#include <gtest/gtest.h>

#include "gguf/gguf.h"

TEST(Gguf, Placeholder) { SUCCEED(); }
