#pragma once
// The consumer's own header, named as one of graphward's is in its tree: graphward must never
// reach it.
#error "graphward included the consumer's own base/error.h"
