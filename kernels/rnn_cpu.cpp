// The LSTM and GRU cells' pointwise work on the CPU: the reference for kernels/rnn.cu (contract in
// rnn.h), each unit by the same function as there (rnn_unit.h).
#include "graphward/kernels/rnn.h"
#include "graphward/kernels/rnn_unit.h"

namespace graphward::kernels::cpu {

template <class T>
void lstm_cell_forward(T* gates, T* h_out, T* c_out, const T* c, const T* b_ih, const T* b_hh,
                       std::int64_t batch, std::int64_t hidden) {
  for (std::int64_t e = 0; e < batch * hidden; ++e) {
    const std::int64_t r = e / hidden, j = e % hidden;
    c_out[e] = detail::lstm_unit_forward(gates + r * 4 * hidden + j, hidden, b_ih, b_hh, j, c[e],
                                         h_out + e);
  }
}

template <class T>
void lstm_cell_backward(T* dgates, T* dc, const T* dh, const T* dh_more, const T* dc_in,
                        const T* dc_more, const T* act, const T* c, const T* c_new,
                        std::int64_t batch, std::int64_t hidden, bool accumulate) {
  for (std::int64_t e = 0; e < batch * hidden; ++e) {
    const std::int64_t r = e / hidden, j = e % hidden;
    const T d =
        detail::lstm_unit_backward(dgates + r * 4 * hidden + j, act + r * 4 * hidden + j, hidden,
                                   dh[e] + (dh_more ? dh_more[e] : T(0)),
                                   dc_in[e] + (dc_more ? dc_more[e] : T(0)), c[e], c_new[e]);
    if (dc) dc[e] = accumulate ? dc[e] + d : d;
  }
}

template <class T>
void gru_cell_forward(T* out, T* act, const T* gx, const T* gh, const T* h, const T* b_ih,
                      const T* b_hh, std::int64_t batch, std::int64_t hidden) {
  for (std::int64_t e = 0; e < batch * hidden; ++e) {
    const std::int64_t r = e / hidden, j = e % hidden;
    out[e] = detail::gru_unit_forward(act + r * 4 * hidden + j, gx + r * 3 * hidden + j,
                                      gh + r * 3 * hidden + j, hidden, b_ih, b_hh, j, h[e]);
  }
}

template <class T>
void gru_cell_backward(T* dgx, T* dgh, T* dh, const T* grad_out, const T* act, const T* h,
                       std::int64_t batch, std::int64_t hidden, bool accumulate) {
  for (std::int64_t e = 0; e < batch * hidden; ++e) {
    const std::int64_t r = e / hidden, j = e % hidden;
    const T d = detail::gru_unit_backward(dgx + r * 3 * hidden + j, dgh + r * 3 * hidden + j,
                                          act + r * 4 * hidden + j, hidden, grad_out[e], h[e]);
    if (dh) dh[e] = accumulate ? dh[e] + d : d;
  }
}

#define GW_INSTANTIATE(T)                                                                       \
  template void lstm_cell_forward<T>(T*, T*, T*, const T*, const T*, const T*, std::int64_t,    \
                                     std::int64_t);                                             \
  template void lstm_cell_backward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*, \
                                      const T*, const T*, std::int64_t, std::int64_t, bool);    \
  template void gru_cell_forward<T>(T*, T*, const T*, const T*, const T*, const T*, const T*,   \
                                    std::int64_t, std::int64_t);                                \
  template void gru_cell_backward<T>(T*, T*, T*, const T*, const T*, const T*, std::int64_t,    \
                                     std::int64_t, bool);
GW_INSTANTIATE(float)
GW_INSTANTIATE(double)
#undef GW_INSTANTIATE

}  // namespace graphward::kernels::cpu
