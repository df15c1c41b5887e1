"""The C++ text of `flashinfer_fp8_jit.py`'s stubs: per launcher kind of FlashInfer's SM90 CUTLASS
fused-MoE kernels, a header that declares the launcher and defines it with a body that throws
(`STUB_INL`), and the same for every MoeGemmRunner but the kept one (`_RUNNER_STUB`), so that the
trimmed `fused_moe_90` module links and loads without compiling those kernels.
"""

from __future__ import annotations

TMA_WS = "moe_gemm_tma_ws_launcher.inl"
MIXED = "moe_gemm_tma_ws_mixed_input_launcher.inl"
FPA_INTB = "fpA_intB_launcher_sm90.inl"
SM80 = "fused_moe_gemm_launcher_sm80.inl"
_NS_OPEN = "namespace tensorrt_llm {\nnamespace kernels {\nnamespace cutlass_kernels_oss {\n"
_NS_CLOSE = (
    "}  // namespace cutlass_kernels_oss\n}  // namespace kernels\n}  // namespace tensorrt_llm\n"
)
_INCLUDES = """#include "cute/tensor.hpp"
#include "cutlass/arch/arch.h"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass_extensions/epilogue_helpers.h"
"""
_THROW = 'throw std::runtime_error("dlmrt trimmed fused_moe_90: this kernel was not built");'

# One stub per launcher kind: the launcher's declaration (its header) and a definition that throws;
# the generated file's own explicit instantiations (or INSTANTIATE_... macro) then emit the symbols.
STUB_INL = {
    TMA_WS: f"""#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdexcept>
{_INCLUDES}#include "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/launchers/moe_gemm_tma_ws_launcher.h"
{_NS_OPEN}using namespace tensorrt_llm::kernels::cutlass_kernels;
using EpilogueFusion = TmaWarpSpecializedGroupedGemmInput::EpilogueFusion;
template <typename Arch, typename T, typename WeightType, typename OutputType,
          typename EpilogueSchedule, typename EpilogueTag,
          TmaWarpSpecializedGroupedGemmInput::EpilogueFusion FUSION, typename TileShape,
          typename ClusterShape, bool IsMXFPX, bool DYNAMIC_CGA, bool BIAS, bool SwapAB>
void tma_warp_specialized_generic_moe_gemm_kernelLauncher(
    TmaWarpSpecializedGroupedGemmInput hopper_input, int num_experts, int multi_processor_count,
    cudaStream_t stream, int* kernel_occupancy, size_t* workspace_size,
    cute::Shape<int32_t, int32_t, cute::_1> dynamic_cluster_shape,
    cute::Shape<int32_t, int32_t, cute::_1> fallback_cluster_shape) {{
  {_THROW}
}}
{_NS_CLOSE}
#define INSTANTIATE_TMA_WARP_SPECIALIZED_MOE_GEMM(ArchTag_, DataType_, WeightType_, OutputType_, \\
    EpilogueSchedule_, EpilogueTag_, FUSION_, CTA_M_, CTA_N_, CTA_K_, CGA_M_, CGA_N_, CGA_K_,    \\
    MXFPX_, DYNAMIC_CGA_, BIAS_, SWAP_AB_)                                                      \\
  template void tma_warp_specialized_generic_moe_gemm_kernelLauncher<                           \\
      cutlass::arch::ArchTag_, DataType_, WeightType_, OutputType_, EpilogueSchedule_,          \\
      tensorrt_llm::cutlass_extensions::EpilogueTag_, EpilogueFusion::FUSION_,                   \\
      cute::Shape<cute::Int<CTA_M_>, cute::Int<CTA_N_>, cute::Int<CTA_K_>>,                      \\
      cute::Shape<cute::Int<CGA_M_>, cute::Int<CGA_N_>, cute::Int<CGA_K_>>, MXFPX_, DYNAMIC_CGA_,\\
      BIAS_, SWAP_AB_>(TmaWarpSpecializedGroupedGemmInput, int, int, cudaStream_t, int*,         \\
                       size_t*, cute::Shape<int32_t, int32_t, cute::_1>,                         \\
                       cute::Shape<int32_t, int32_t, cute::_1>);
""",
    MIXED: f"""#pragma once
#include <stdexcept>
{_INCLUDES}#include "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/launchers/moe_gemm_tma_ws_mixed_input_launcher.h"
{_NS_OPEN}using namespace tensorrt_llm::kernels::cutlass_kernels;
namespace tkc = tensorrt_llm::cutlass_extensions;
#ifdef ENABLE_FP4
using SafeFP4 = Fp4Type;
#else
struct SafeFP4 {{}};
#endif
template <typename T, typename WeightType, typename GemmOutputType, typename EpilogueTag,
          typename CTAShape, typename ClusterShape, typename MainloopScheduleType,
          typename EpilogueScheduleType, cutlass::WeightOnlyQuantOp QuantOp,
          cutlass::gemm::collective::MixedInputScaleMode ScaleMode>
void sm90_generic_mixed_moe_gemm_kernelLauncher(
    GroupedGemmInput<T, WeightType, GemmOutputType, GemmOutputType> inputs,
    TmaWarpSpecializedGroupedGemmInput hopper_inputs, int sm_count_, size_t* workspace_size) {{
  {_THROW}
}}
template <typename T, typename WeightType, typename GemmOutputType, typename EpilogueTag,
          typename CTAShape, typename ClusterShape, typename MainloopScheduleType,
          typename EpilogueScheduleType, cutlass::WeightOnlyQuantOp QuantOp,
          cutlass::gemm::collective::MixedInputScaleMode ScaleMode,
          tkc::MainloopScheduleType KernelType>
void sm90_generic_mixed_moe_small_k_kernelLauncher(
    GroupedGemmInput<T, WeightType, GemmOutputType, GemmOutputType> inputs,
    TmaWarpSpecializedGroupedGemmInput hopper_inputs, int sm_count_, size_t* workspace_size) {{
  {_THROW}
}}
{_NS_CLOSE}""",
    FPA_INTB: f"""#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdexcept>
{_INCLUDES}#include "tensorrt_llm/kernels/cutlass_kernels/fpA_intB_gemm/launchers/fpA_intB_launcher_sm90.h"
{_NS_OPEN}template <typename ActivationType, typename WeightType, typename ScaleZeroType,
          typename BiasType, typename OutputType, cutlass::WeightOnlyQuantOp QuantOp,
          typename EpilogueTag, typename CTAShape, typename ClusterShape,
          typename MainloopScheduleType, typename EpilogueScheduleType>
void sm90_generic_mixed_gemm_kernelLauncher(
    ActivationType const* A, WeightType const* B, ScaleZeroType const* weight_scales,
    ScaleZeroType const* weight_zero_points, BiasType const* biases, float const alpha,
    OutputType* C, int m, int n, int k, int const group_size,
    tensorrt_llm::cutlass_extensions::CutlassGemmConfig gemm_config, char* workspace,
    size_t workspace_bytes, cudaStream_t stream, int* occupancy) {{
  {_THROW}
}}
{_NS_CLOSE}""",
    SM80: f"""#pragma once
#include <stdexcept>
{_INCLUDES}#include "tensorrt_llm/kernels/cutlass_kernels/moe_gemm/launchers/fused_moe_gemm_launcher_sm80.h"
namespace tensorrt_llm::kernels::cutlass_kernels_oss {{
template <typename ElementType_, typename CutlassWeightType_, int MaxTileM_, int TileN_, int TileK_,
          int Stages_, typename EpilogueTag>
void sm80_generic_fused_moe_gemm_kernelLauncher(ElementType_ const* A, CutlassWeightType_ const* B,
                                                ElementType_ const* biases, bool bias_is_broadcast,
                                                ElementType_* C,
                                                int64_t const* total_tokens_including_expert,
                                                int64_t num_rows, int64_t gemm_n, int64_t gemm_k,
                                                int num_experts, int multi_processor_count,
                                                cudaStream_t stream, int* kernel_occupancy) {{
  {_THROW}
}}
}}  // namespace tensorrt_llm::kernels::cutlass_kernels_oss
""",
}

# MoeGemmRunner (moe_gemm_template_dispatch.h) for every dtype but the kept one: the class
# declaration and member definitions that throw, so that its explicit instantiations link.
_RUNNER_STUB = f"""#pragma once
#include <stdexcept>
#include "moe_gemm_kernels.h"
namespace tensorrt_llm::kernels::cutlass_kernels {{
#define DLMRT_T template <typename T, typename W, typename O, typename S, bool X, \\
                          Sm90Wfp4Afp8ScaleMode M>
#define DLMRT_C MoeGemmRunner<T, W, O, S, X, M>
#define DLMRT_THROW {_THROW}
using tensorrt_llm::cutlass_extensions::CutlassGemmConfig;
DLMRT_T DLMRT_C::MoeGemmRunner() {{}}
DLMRT_T void DLMRT_C::moeGemmBiasAct(GroupedGemmInput<T, W, S, O>,
                                     TmaWarpSpecializedGroupedGemmInput) {{ DLMRT_THROW }}
DLMRT_T void DLMRT_C::moeGemm(GroupedGemmInput<T, W, S, O>,
                              TmaWarpSpecializedGroupedGemmInput) {{ DLMRT_THROW }}
DLMRT_T std::vector<CutlassGemmConfig> DLMRT_C::getConfigs(bool) const {{ DLMRT_THROW }}
DLMRT_T std::vector<CutlassGemmConfig> DLMRT_C::getConfigs(int, bool) {{ DLMRT_THROW }}
DLMRT_T std::vector<CutlassGemmConfig> DLMRT_C::getTmaWarpSpecializedConfigs(int, bool) {{
  DLMRT_THROW }}
DLMRT_T std::vector<CutlassGemmConfig> DLMRT_C::getAmpereConfigs(int) {{ DLMRT_THROW }}
DLMRT_T bool DLMRT_C::isTmaWarpSpecialized(CutlassGemmConfig) const {{ DLMRT_THROW }}
DLMRT_T bool DLMRT_C::supportsTmaWarpSpecialized(int) {{ DLMRT_THROW }}
DLMRT_T bool DLMRT_C::isFusedGatedActivation(CutlassGemmConfig, ActivationType, int, int) const {{
  DLMRT_THROW }}
DLMRT_T bool DLMRT_C::supportsFusedGatedActivation(ActivationType, int, int) const {{
  DLMRT_THROW }}
DLMRT_T size_t DLMRT_C::getMaxWorkspaceSize(int) const {{ DLMRT_THROW }}
DLMRT_T int DLMRT_C::getSM() const {{ DLMRT_THROW }}
DLMRT_T int DLMRT_C::queryOccupancyForConfig(CutlassGemmConfig const&) {{ DLMRT_THROW }}
DLMRT_T size_t DLMRT_C::calcMaxWorkspaceSize(int) const {{ DLMRT_THROW }}
}}  // namespace tensorrt_llm::kernels::cutlass_kernels
"""
