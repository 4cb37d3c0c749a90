// dcp: PyTorch Distributed Checkpoint for C++. Includes the whole public API.
#pragma once

#include "dcp/async_save.h"
#include "dcp/checkpoint.h"
#include "dcp/checkpoint_manager.h"
#include "dcp/communicator.h"
#include "dcp/events.h"
#include "dcp/filesystem.h"
#include "dcp/format_utils.h"
#include "dcp/hf_storage.h"
#include "dcp/in_process_communicator.h"
#include "dcp/memory_storage.h"
#include "dcp/metadata.h"
#include "dcp/object_path.h"
#include "dcp/planner.h"
#include "dcp/sharded_tensor.h"
#include "dcp/state_dict.h"
#include "dcp/stateful.h"
#include "dcp/storage.h"
#include "dcp/torch_state_dict.h"
#include "dcp/verify.h"

#ifdef DCP_WITH_MPI
#include "dcp/mpi_communicator.h"
#endif
#ifdef DCP_WITH_NCCL
#include "dcp/nccl_communicator.h"
#endif
