/* The C ABI of kernels/include/flashlab.h implemented on host memory, in double precision, for
 * bf16 tensors: what python/tests/test_ops_host_abi.py loads in place of the CUDA library to check,
 * without a GPU, that flashlab.ops hands the ABI what its contract says (strides in elements as
 * (batch, row, head), the LSE's layout, varlen offsets, GQA heads, the backward's arguments). It
 * reads every tensor only through the pointers and strides it is given, as the kernels do. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "flashlab.h"

static const char* message = "";

int flashlab_abi_version(void) { return FLASHLAB_ABI_VERSION; }
const char* flashlab_last_error(void) { return message; }
int flashlab_generation_built(int generation) { return generation >= 1 && generation <= 3 ? 1 : -1; }

static double load(const void* data, const int64_t* strides, int64_t batch, int64_t row, int head, int col) {
  const uint16_t bits = ((const uint16_t*)data)[batch * strides[0] + row * strides[1] + head * strides[2] + col];
  uint32_t wide = (uint32_t)bits << 16;
  float value;
  memcpy(&value, &wide, sizeof value);
  return value;
}

static void store(void* data, const int64_t* strides, int64_t batch, int64_t row, int head, int col, double x) {
  float value = (float)x;
  uint32_t wide;
  memcpy(&wide, &value, sizeof wide);
  wide += 0x7FFF + ((wide >> 16) & 1); /* round to nearest even */
  ((uint16_t*)data)[batch * strides[0] + row * strides[1] + head * strides[2] + col] = (uint16_t)(wide >> 16);
}

/* Sequence b: its batch index for batch_stride (0 for varlen), first rows and lengths. */
static void sequence(const FlashlabProblem* p, int b, int64_t* batch, int64_t* first_q, int64_t* first_k, int* len_q,
                     int* len_k) {
  if (p->cu_seqlens_q_host != NULL) {
    *batch = 0, *first_q = p->cu_seqlens_q_host[b], *first_k = p->cu_seqlens_k_host[b];
    *len_q = p->cu_seqlens_q_host[b + 1] - p->cu_seqlens_q_host[b];
    *len_k = p->cu_seqlens_k_host[b + 1] - p->cu_seqlens_k_host[b];
  } else {
    *batch = b, *first_q = 0, *first_k = 0, *len_q = p->seqlen_q, *len_k = p->seqlen_k;
  }
}

static int visible(const FlashlabProblem* p, int len_q, int len_k, int i, int j) {
  const int diagonal = i + (p->alignment == 1 ? len_k - len_q : 0);
  const int right = p->causal ? 0 : p->window_right; /* causal: min(right, 0), and -1 is unbounded */
  return (right < 0 || j <= diagonal + right) && (p->window_left < 0 || j >= diagonal - p->window_left);
}

static double scale_of(const FlashlabProblem* p) {
  return p->softmax_scale > 0 ? p->softmax_scale : 1.0 / sqrt((double)p->head_dim);
}

static int refuse_unless_bf16(const FlashlabProblem* p) {
  if (p->dtype == 2 && p->head_dim <= 512) return 0;
  message = "host stub: dtype, head_dim; allowed: 2 (bf16), at most 512";
  return 1;
}

int flashlab_forward(int generation, const FlashlabProblem* p, void* q, const int64_t* qs, void* k,
                     const int64_t* ks, void* v, const int64_t* vs, void* o, const int64_t* os, float* lse,
                     const int64_t* ls, void* stream) {
  (void)generation, (void)stream;
  if (refuse_unless_bf16(p)) return FLASHLAB_REFUSED;
  const int group = p->heads_q / p->heads_kv, d = p->head_dim;
  const double scale = scale_of(p);
  for (int b = 0; b < p->batch; ++b) {
    int64_t batch, first_q, first_k;
    int len_q, len_k;
    sequence(p, b, &batch, &first_q, &first_k, &len_q, &len_k);
    for (int h = 0; h < p->heads_q; ++h) {
      for (int i = 0; i < len_q; ++i) {
        double row_max = -INFINITY, sum = 0, acc[512] = {0};
        for (int j = 0; j < len_k; ++j) {
          if (!visible(p, len_q, len_k, i, j)) continue;
          double s = 0;
          for (int c = 0; c < d; ++c) s += load(q, qs, batch, first_q + i, h, c) * load(k, ks, batch, first_k + j, h / group, c);
          row_max = fmax(row_max, s * scale);
        }
        for (int j = 0; j < len_k && row_max > -INFINITY; ++j) {
          if (!visible(p, len_q, len_k, i, j)) continue;
          double s = 0;
          for (int c = 0; c < d; ++c) s += load(q, qs, batch, first_q + i, h, c) * load(k, ks, batch, first_k + j, h / group, c);
          const double w = exp(s * scale - row_max);
          sum += w;
          for (int c = 0; c < d; ++c) acc[c] += w * load(v, vs, batch, first_k + j, h / group, c);
        }
        for (int c = 0; c < d; ++c) store(o, os, batch, first_q + i, h, c, sum > 0 ? acc[c] / sum : 0.0);
        lse[batch * ls[0] + (first_q + i) * ls[1] + h * ls[2]] = sum > 0 ? (float)(row_max + log(sum)) : -INFINITY;
      }
    }
  }
  message = "";
  return FLASHLAB_OK;
}

int flashlab_fa3_forward_steps(int ping_pong, int overlap, int persistent, const FlashlabProblem* p, void* q,
                               const int64_t* qs, void* k, const int64_t* ks, void* v, const int64_t* vs, void* o,
                               const int64_t* os, float* lse, const int64_t* ls, void* stream) {
  (void)ping_pong, (void)overlap, (void)persistent;
  return flashlab_forward(3, p, q, qs, k, ks, v, vs, o, os, lse, ls, stream);
}

int flashlab_sm90_gemm_bf16(const void* a, const void* b, void* c, int m, int n, int k, void* stream) {
  (void)a, (void)b, (void)c, (void)m, (void)n, (void)k, (void)stream;
  message = "host stub: no GEMM; allowed: none";
  return FLASHLAB_REFUSED;
}

/* FA2 Algorithm 2 in double: P from the given LSE, D = rowsum(dO o O), dS = P o (dP - D). dK and
 * dV sum over a KV head's query heads, accumulated in double and stored once. */
int flashlab_backward(int generation, const FlashlabProblem* p, int deterministic, void* q, const int64_t* qs, void* k,
                      const int64_t* ks, void* v, const int64_t* vs, void* o, const int64_t* os, float* lse,
                      const int64_t* ls, void* d_o, const int64_t* dos, void* dq, const int64_t* dqs, void* dk,
                      const int64_t* dks, void* dv, const int64_t* dvs, void* stream) {
  (void)generation, (void)deterministic, (void)stream;
  if (refuse_unless_bf16(p)) return FLASHLAB_REFUSED;
  const int group = p->heads_q / p->heads_kv, d = p->head_dim;
  const double scale = scale_of(p);
  for (int b = 0; b < p->batch; ++b) {
    int64_t batch, first_q, first_k;
    int len_q, len_k;
    sequence(p, b, &batch, &first_q, &first_k, &len_q, &len_k);
    for (int hk = 0; hk < p->heads_kv; ++hk) {
      for (int j = 0; j < len_k; ++j) {
        double dk_acc[512] = {0}, dv_acc[512] = {0};
        for (int h = hk * group; h < (hk + 1) * group; ++h) {
          for (int i = 0; i < len_q; ++i) {
            const float row_lse = lse[batch * ls[0] + (first_q + i) * ls[1] + h * ls[2]];
            if (!visible(p, len_q, len_k, i, j) || isinf(row_lse)) continue;
            double s = 0, dp = 0, delta = 0;
            for (int c = 0; c < d; ++c) {
              s += load(q, qs, batch, first_q + i, h, c) * load(k, ks, batch, first_k + j, hk, c);
              dp += load(d_o, dos, batch, first_q + i, h, c) * load(v, vs, batch, first_k + j, hk, c);
              delta += load(d_o, dos, batch, first_q + i, h, c) * load(o, os, batch, first_q + i, h, c);
            }
            const double prob = exp(s * scale - row_lse), ds = prob * (dp - delta);
            for (int c = 0; c < d; ++c) {
              dv_acc[c] += prob * load(d_o, dos, batch, first_q + i, h, c);
              dk_acc[c] += ds * scale * load(q, qs, batch, first_q + i, h, c);
            }
          }
        }
        for (int c = 0; c < d; ++c) {
          store(dk, dks, batch, first_k + j, hk, c, dk_acc[c]);
          store(dv, dvs, batch, first_k + j, hk, c, dv_acc[c]);
        }
      }
    }
    for (int h = 0; h < p->heads_q; ++h) {
      for (int i = 0; i < len_q; ++i) {
        const float row_lse = lse[batch * ls[0] + (first_q + i) * ls[1] + h * ls[2]];
        double dq_acc[512] = {0}, delta = 0;
        for (int c = 0; c < d; ++c) delta += load(d_o, dos, batch, first_q + i, h, c) * load(o, os, batch, first_q + i, h, c);
        for (int j = 0; j < len_k; ++j) {
          if (!visible(p, len_q, len_k, i, j) || isinf(row_lse)) continue;
          double s = 0, dp = 0;
          for (int c = 0; c < d; ++c) {
            s += load(q, qs, batch, first_q + i, h, c) * load(k, ks, batch, first_k + j, h / group, c);
            dp += load(d_o, dos, batch, first_q + i, h, c) * load(v, vs, batch, first_k + j, h / group, c);
          }
          const double ds = exp(s * scale - row_lse) * (dp - delta);
          for (int c = 0; c < d; ++c) dq_acc[c] += ds * scale * load(k, ks, batch, first_k + j, h / group, c);
        }
        for (int c = 0; c < d; ++c) store(dq, dqs, batch, first_q + i, h, c, dq_acc[c]);
      }
    }
  }
  message = "";
  return FLASHLAB_OK;
}

/* Decoding in double: the new tokens copied into the cache at cache_seqlens (read through the host
 * copies, which the stub requires; on the host, "device" arrays are host arrays too), then every
 * query token against its sequence's keys through the block table. No workspace is used. */
static int64_t cache_row(const FlashlabKvCache* c, int b, int key, int64_t* batch_index) {
  if (c->block_table == NULL) return *batch_index = b, key;
  *batch_index = c->block_table[(int64_t)b * c->max_pages_per_sequence + key / c->page_size];
  return key % c->page_size;
}

int flashlab_decode(const FlashlabProblem* p, const FlashlabKvCache* c, int num_splits, void* q, const int64_t* qs,
                    void* o, const int64_t* os, float* lse, const int64_t* ls, void* workspace, int64_t workspace_bytes,
                    int stream_only, void* stream) {
  (void)num_splits, (void)workspace, (void)workspace_bytes, (void)stream;
  if (refuse_unless_bf16(p)) return FLASHLAB_REFUSED;
  if (c->host_cache_seqlens == NULL || stream_only) {
    message = "host stub: host_cache_seqlens, stream_only; allowed: given, 0";
    return FLASHLAB_REFUSED;
  }
  const int group = p->heads_q / p->heads_kv, d = p->head_dim, tokens = p->seqlen_q;
  const double scale = scale_of(p);
  for (int b = 0; b < p->batch; ++b) {
    const int keys = c->host_cache_seqlens[b] + c->seqlen_new;
    for (int j = 0; j < c->seqlen_new; ++j) {
      for (int h = 0; h < p->heads_kv; ++h) {
        int64_t page;
        const int64_t slot = cache_row(c, b, c->host_cache_seqlens[b] + j, &page);
        for (int col = 0; col < d; ++col) {
          store(c->k_cache, c->k_cache_strides, page, slot, h, col, load(c->k_new, c->k_new_strides, b, j, h, col));
          store(c->v_cache, c->v_cache_strides, page, slot, h, col, load(c->v_new, c->v_new_strides, b, j, h, col));
        }
      }
    }
    for (int h = 0; h < p->heads_q; ++h) {
      for (int t = 0; t < tokens; ++t) {
        const int last = p->causal ? t + keys - tokens : keys - 1; /* bottom-right */
        double row_max = -INFINITY, sum = 0, acc[512] = {0};
        for (int pass = 0; pass < 2; ++pass) {
          for (int key = 0; key <= last && key < keys; ++key) {
            int64_t page;
            const int64_t slot = cache_row(c, b, key, &page);
            double dot = 0;
            for (int col = 0; col < d; ++col) {
              dot += load(q, qs, b, t, h, col) * load(c->k_cache, c->k_cache_strides, page, slot, h / group, col);
            }
            if (pass == 0) {
              row_max = fmax(row_max, dot * scale);
              continue;
            }
            const double w = exp(dot * scale - row_max);
            sum += w;
            for (int col = 0; col < d; ++col) acc[col] += w * load(c->v_cache, c->v_cache_strides, page, slot, h / group, col);
          }
        }
        for (int col = 0; col < d; ++col) store(o, os, b, t, h, col, sum > 0 ? acc[col] / sum : 0.0);
        lse[b * ls[0] + t * ls[1] + h * ls[2]] = sum > 0 ? (float)(row_max + log(sum)) : -INFINITY;
      }
    }
  }
  message = "";
  return FLASHLAB_OK;
}

int flashlab_decode_workspace_bytes(const FlashlabProblem* p, const FlashlabKvCache* c, int num_splits, int64_t* bytes) {
  (void)p, (void)c, (void)num_splits;
  *bytes = 0;
  message = "";
  return FLASHLAB_OK;
}
