// The program scripts/host_profile.sh is tested on: hot_a is called once from main and twice from
// hot_b in every round, so two thirds of its samples must name hot_b as the caller and one third
// main.
#include <cmath>
#include <cstdio>

__attribute__((noinline)) double hot_a(int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::sqrt(i * 1.0 + s * 1e-9);
  return s;
}
__attribute__((noinline)) double hot_b(int n) {
  return hot_a(n) + hot_a(n);
}

int main() {
  double s = 0;
  for (int k = 0; k < 60; ++k) s += hot_a(1000000) + hot_b(1000000);
  std::printf("%f\n", s);
  return 0;
}
