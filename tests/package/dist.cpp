// A consumer of the dist component (find_package(graphward COMPONENTS dist), graphward::dist): a
// group of one on the CPU averages a tensor over its one rank, which leaves it as it was.
#include <cstdio>

#include <graphward/graphward_dist.h>
namespace gw = graphward;

int main() {
  gw::dist::ProcessGroup group({.rank = 0, .world_size = 1, .device = gw::Device::cpu()});
  const gw::Tensor t = gw::full({4}, 2.5, {gw::DType::kFloat32, gw::Device::cpu()});
  group.all_reduce_average({t});
  const bool ok = group.world_size() == 1 && t.to_vector<float>() == std::vector<float>(4, 2.5f);
  std::printf("dist consumer: a group of %d, the average %s\n", group.world_size(),
              ok ? "as it was" : "CHANGED");
  return ok ? 0 : 1;
}
