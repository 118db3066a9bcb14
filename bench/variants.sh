# The decode variants of bench/gpu_run.sh and bench/quant_run.sh (sourced; needs $hot_blocks):
# variant_env, the switch variables a variant of pyqsa's library runs under, and variant_args,
# every variant's bench/decode.py flags. What each one is: gpu_run.sh's --variants.
declare -A variant_env=([cores]=PYQSA_QSA_ATTN_MMA=0 [moesync]=PYQSA_CUDA_MOE_SYNC=1
                        [f16acc]=PYQSA_CUDA_F16_ACCUMULATE=1 [gdnup]=PYQSA_CUDA_GDN_UPSTREAM=1
                        [moemmf]=PYQSA_CUDA_MOE_MMF=1 [gemvup]=PYQSA_CUDA_GEMV_UPSTREAM=1
                        [hcunf]=PYQSA_HC_UNFUSED=1 [ungrp]=PYQSA_CUDA_PRODUCTS_UNGROUPED=1
                        [gatesunf]=PYQSA_GATES_UNFUSED=1 [topk1]=PYQSA_CUDA_TOPK_ONE_CTA=1
                        [hcmixunf]=PYQSA_HC_MIX_UNFUSED=1 [combapart]=PYQSA_CUDA_HC_COMBINE_APART=1
                        [mix8]=PYQSA_HC_MIX_TOKENS=8 [gdnconvapart]=PYQSA_CUDA_GDN_CONV_APART=1
                        [joinunf]=PYQSA_HC_JOIN_UNFUSED=1 [inputsync]=PYQSA_SCHED_INPUTS_SYNC=1
                        [chunk1]=PYQSA_CUDA_GEMV_ONE_CHUNK=1
                        [fastoff]="PYQSA_CUDA_GEMV_UPSTREAM=1 PYQSA_CUDA_PRODUCTS_UNGROUPED=1
                                   PYQSA_HC_UNFUSED=1 PYQSA_GATES_UNFUSED=1 PYQSA_HC_MIX_UNFUSED=1
                                   PYQSA_CUDA_TOPK_ONE_CTA=1 PYQSA_SCHED_INPUTS_SYNC=1"
                        [quantup]="PYQSA_CUDA_GEMV_UPSTREAM=1 PYQSA_HC_MIX_UNFUSED=1")
declare -A variant_args=([pyqsa]="--variant pyqsa" [paged]="--variant pyqsa --hot-blocks $hot_blocks"
                         [pagedq8]="--variant pyqsa --hot-blocks $hot_blocks --kv-type q8_0"
                         [pagedq8f16]="--variant pyqsa --hot-blocks $hot_blocks --kv-type q8_0 --kv-hot-type f16"
                         [sampled]="--variant pyqsa --sampling device" [upstream]="--variant upstream")
for v in "${!variant_env[@]}"; do variant_args[$v]="--variant pyqsa"; done
