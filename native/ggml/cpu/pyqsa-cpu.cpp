// CPU dispatch of GGML_OP_PYQSA on the sub-op in op_params[0].
#include "pyqsa-cpu.h"

#include "add-gated.h"
#include "conv-step.h"
#include "gdn-gates.h"
#include "ggml-impl.h"
#include "hc-combine.h"
#include "hc-mix.h"
#include "pyqsa-ggml.h"
#include "qsa-attn.h"
#include "qsa-attn-part.h"
#include "qsa-block-cells.h"
#include "qsa-mask-cells.h"
#include "qsa-page-fetch.h"
#include "qsa-page-resolve.h"
#include "qsa-page-stage.h"
#include "qsa-page-write.h"
#include "qsa-score.h"
#include "qsa-topk.h"
#include "rms-norm-gated.h"
#include "sample.h"
#include "silu-scaled.h"

void pyqsa_cpu_forward(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    switch (ggml_get_op_params_i32(dst, 0)) {
        case PYQSA_GGML_OP_QSA_ATTN:
            pyqsa_cpu_qsa_attn(params, dst);
            break;
        case PYQSA_GGML_OP_QSA_MASK_CELLS:
            pyqsa_cpu_qsa_mask_cells(params, dst);
            break;
        case PYQSA_GGML_OP_QSA_TOPK:
            pyqsa_cpu_qsa_topk(params, dst);
            break;
        case PYQSA_GGML_OP_QSA_BLOCK_CELLS:
            pyqsa_cpu_qsa_block_cells(params, dst);
            break;
        case PYQSA_GGML_OP_QSA_SCORE:
            pyqsa_cpu_qsa_score(params, dst);
            break;
        case PYQSA_GGML_OP_QSA_PAGE_RESOLVE:
            pyqsa_cpu_qsa_page_resolve(params, dst);
            break;
        case PYQSA_GGML_OP_QSA_PAGE_STAGE:
            pyqsa_cpu_qsa_page_stage(params, dst);
            break;
        case PYQSA_GGML_OP_QSA_PAGE_WRITE:
            pyqsa_cpu_qsa_page_write(params, dst);
            break;
        case PYQSA_GGML_OP_QSA_ATTN_PART:
            pyqsa_cpu_qsa_attn_part(params, dst);
            break;
        case PYQSA_GGML_OP_SAMPLE:
            pyqsa_cpu_sample(params, dst);
            break;
        case PYQSA_GGML_OP_QSA_PAGE_FETCH:
            pyqsa_cpu_qsa_page_fetch(params, dst);
            break;
        case PYQSA_GGML_OP_QSA_PAGE_FETCH_WAIT:
            break;
        case PYQSA_GGML_OP_HC_COMBINE:
            pyqsa_cpu_hc_combine(params, dst);
            break;
        case PYQSA_GGML_OP_SILU_SCALED:
            pyqsa_cpu_silu_scaled(params, dst);
            break;
        case PYQSA_GGML_OP_GDN_GATES:
            pyqsa_cpu_gdn_gates(params, dst);
            break;
        case PYQSA_GGML_OP_ADD_GATED:
            pyqsa_cpu_add_gated(params, dst);
            break;
        case PYQSA_GGML_OP_CONV_STEP:
            pyqsa_cpu_conv_step(params, dst);
            break;
        case PYQSA_GGML_OP_RMS_NORM_GATED:
            pyqsa_cpu_rms_norm_gated(params, dst);
            break;
        case PYQSA_GGML_OP_HC_DOWN:
            pyqsa_cpu_hc_down(params, dst);
            break;
        case PYQSA_GGML_OP_HC_PRE:
            pyqsa_cpu_hc_pre(params, dst);
            break;
        default:
            GGML_ABORT("pyqsa: unknown sub-op %d", ggml_get_op_params_i32(dst, 0));
    }
}

size_t pyqsa_cpu_work_size(const struct ggml_tensor * dst) {
    switch (ggml_get_op_params_i32(dst, 0)) {
        case PYQSA_GGML_OP_CONV_STEP:
            return pyqsa_cpu_conv_step_work_size(dst);
        case PYQSA_GGML_OP_HC_DOWN:
            return pyqsa_cpu_hc_down_work_size(dst);
        default:
            return 0;
    }
}
