#pragma once
#error "graphward included the consumer's own graphward.h"
