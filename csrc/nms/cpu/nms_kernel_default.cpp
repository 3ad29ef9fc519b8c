// nms CPU suppression loop: the portable variant.
#include <type_traits>
#define OPFORGE_CPU_VARIANT_NS cpu_default
#include "nms/cpu/nms_kernel_impl.h"
