"""ggml_lite — ggml's memory planner and backend scheduler, ported to Python from literate notebooks.

The modules are exported from `notebooks/*.py` (see each module's header); this file only gathers the
public names so that `import ggml_lite as gl` gives the API of DESIGN.md §4.
"""

import logging

# Appendix A7's kernels (ADD1, SQR, SUM, NORM, ...) join the CPU backend's table when imported: importing them
# here gives every user of the package every kernel, whatever module they import first.
from ggml_lite import (
    cpu_kernels_more,  # noqa: F401
    errors,  # noqa: F401  (gl.errors: every exception of the package)
    models,  # noqa: F401  (gl.models.llama: chapter 10)
    planners,  # noqa: F401  (chapter 11: gl.planners.greedy_by_size, exact, best, ...)
    verify,  # noqa: F401  (gl.verify.verify_plans, ReferenceRun, ...: a plan verified by computing it)
)
from ggml_lite.align import GGML_PAD, aligned_offset, is_power_of_two  # noqa: F401
from ggml_lite.backend import (  # noqa: F401
    Backend,
    Event,
    GraphCopy,
    GraphPlan,
    Status,
    compare_graph_backend,
    dup_tensor_layout,
    graph_copy,
    graph_copy_free,
    tensor_copy,
    tensor_copy_async,
    tensor_get,
    tensor_set,
)
from ggml_lite.buffer import (  # noqa: F401
    SIZE_MAX,
    TENSOR_ALIGNMENT,
    Buffer,
    BufferType,
    BufferUsage,
    CPUBuffer,
    CPUBufferType,
    MultiBuffer,
    buffer_copy_tensor,
    cpu_buffer_from_ptr,
    cpu_buffer_type,
    multi_buffer_alloc_buffer,
    tensor_alloc,
    tensor_array,
    view_init,
)
from ggml_lite.cpu import Arithmetic, CPUBackend, cpu_init, is_cpu  # noqa: F401
from ggml_lite.dyn_tallocr import MAX_FREE_BLOCKS, AllocEvent, DynTAllocr, FreeEvent, ResetEvent  # noqa: F401
from ggml_lite.errors import *  # noqa: F403
from ggml_lite.exact import ExactArithmetic  # noqa: F401  (declares the tier cpu_init(exact=True) uses)
from ggml_lite.gallocr import (  # noqa: F401
    CAN_INPLACE,
    GAllocr,
    HashNode,
    LeafAlloc,
    NodeAlloc,
    TensorAlloc,
    is_view,
    op_can_inplace,
)
from ggml_lite.gallocr_today import (  # noqa: F401
    VBUFFER_MAX_CHUNKS,
    BufferAddress,
    ChunkedDynTAllocr,
    GAllocr2026,
    VBuffer,
    new_gallocr,
)
from ggml_lite.graph import (  # noqa: F401
    GGML_DEFAULT_GRAPH_SIZE,
    Graph,
    build_forward,
    build_forward_expand,
    graph_view,
    visit_parents,
)
from ggml_lite.graphio import GraphFile, graph_document, load_graph, read_graph_file, save_graph_file  # noqa: F401
from ggml_lite.models import llama as _llama  # noqa: F401
from ggml_lite.ops import (  # noqa: F401
    GGML_KQ_MASK_PAD,
    GGML_PREC_DEFAULT,
    GGML_PREC_F32,
    SortOrder,
    add,
    add1,
    add_inplace,
    argsort,
    cast,
    concat,
    cont,
    cont_2d,
    cont_3d,
    cont_4d,
    cpy,
    diag_mask_inf,
    diag_mask_zero,
    div,
    div_inplace,
    dup,
    exp,
    flash_attn_ext,
    flash_attn_ext_set_prec,
    gelu,
    get_rows,
    leaky_relu,
    log,
    mean,
    mul,
    mul_inplace,
    mul_mat,
    mul_mat_id,
    neg,
    norm,
    permute,
    relu,
    reshape,
    reshape_1d,
    reshape_2d,
    reshape_3d,
    reshape_4d,
    rms_norm,
    rope_ext,
    scale,
    scale_inplace,
    silu,
    soft_max,
    soft_max_ext,
    sqr,
    sqrt,
    sub,
    sub_inplace,
    sum,
    sum_rows,
    tanh,
    top_k,
    transpose,
    unary,
    view_1d,
    view_2d,
    view_3d,
    view_4d,
)
from ggml_lite.plancheck import Plan, check_plan_file, plan_of, run_plan  # noqa: F401
from ggml_lite.planners import (  # noqa: F401
    PLANNER_NAMES,
    Block,
    PlanResult,
    Problem,
    all_plans,
    alloc_planned,
    blocks_of,
    check_placement,
    problem_from_blocks,
    problem_from_intervals,
    run_planner,
)
from ggml_lite.registry import (  # noqa: F401
    reg_alloc_buffer,
    reg_find_by_name,
    reg_get_count,
    reg_get_default_buffer_type,
    reg_get_name,
    reg_init_backend,
    reg_init_backend_from_str,
    register,
)
from ggml_lite.report import MemoryReport, memory_report  # noqa: F401
from ggml_lite.sched import BackendSched, Split  # noqa: F401
from ggml_lite.sched_today import BackendSched2026  # noqa: F401
from ggml_lite.sim import CostModel, SimBackend, SimBufferType, SimClock, Span, is_sim, sim_init  # noqa: F401
from ggml_lite.tallocr import TAllocr, alloc_ctx_tensors, alloc_ctx_tensors_from_buft, alloc_tensor_range  # noqa: F401
from ggml_lite.tensor import (  # noqa: F401
    F16,
    F32,
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGML_MAX_OP_PARAMS,
    GGML_MAX_SRC,
    I32,
    Q4_0,
    Q8_0,
    TYPES,
    VIEW_OPS,
    Context,
    GGMLType,
    Op,
    Tensor,
    TensorFlag,
    UnaryOp,
    are_same_layout,
    are_same_shape,
    can_repeat,
    contiguous_strides,
    describe,
    float_to_word,
    is_contiguous,
    is_contiguous_1,
    is_contiguous_n,
    is_empty,
    is_matrix,
    is_padded_1d,
    is_scalar,
    is_transposed,
    is_vector,
    is_view_op,
    nbytes,
    nelements,
    nrows,
    op_by_name,
    row_size,
    set_input,
    set_output,
    set_param,
    type_by_name,
    word_to_float,
)
from ggml_lite.verify import Verification, verify_plan  # noqa: F401

# The reference's diagnostics go to the "ggml_lite" logger; an application decides whether to show them.
logging.getLogger("ggml_lite").addHandler(logging.NullHandler())
