// The communicator's options and plain types (AllToAllLayout, CommStats) and its lifetime; the
// three phases of an operation are in communicator_phases.cpp, the collectives in
// communicator_collectives.cpp.
#include "epo/comm/communicator.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "epo/comm/communicator_internal.h"
#include "epo/comm/link_limits.h"
#include "epo/comm/mpi_runtime.h"
#include "epo/core/error.h"

namespace epo::comm {

namespace detail {

const char* op_name(uint32_t kind) {
    switch (kind) {
        case 1:
            return "all_to_all";
        case 2:
            return "all_gather";
        case 3:
            return "all_reduce";
        case 4:
            return "broadcast";
        case 5:
            return "barrier";
        case 6:
            return "reduce_scatter";
        case 7:
            return "all_gather_shards";
    }
    return "unknown operation";
}

int to_int(int64_t v, const std::string& what) {
    if (v < 0 || v > INT_MAX) {
        throw Error(ErrorKind::kComm,
                    fmt::format("{} = {} is outside MPI's count range [0, {}]: split the transfer "
                                "or use larger items",
                                what, v, INT_MAX));
    }
    return static_cast<int>(v);
}

}  // namespace detail

void validate_comm_options(const CommOptions& options) {
    if (!std::isfinite(options.timeout_s) || options.timeout_s <= 0 ||
        options.timeout_s > kMaxTimeoutS) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("comm.timeout_s={} is not a number of seconds in (0, {:g}]: set "
                                "the longest wait on a peer, e.g. 300",
                                options.timeout_s, kMaxTimeoutS));
    }
    validate_link_model(options.link);
    const auto& w = options.wait;
    if (!(w.spin_us >= 0 && w.min_sleep_us > 0 && w.max_sleep_us >= w.min_sleep_us)) {
        throw Error(ErrorKind::kConfig,
                    fmt::format("wait policy spin_us={} min_sleep_us={} max_sleep_us={}: need "
                                "spin >= 0 and 0 < min_sleep <= max_sleep",
                                w.spin_us, w.min_sleep_us, w.max_sleep_us));
    }
    const auto& d = options.data_wait;
    if (!(d.sleep_fraction > 0 && d.sleep_fraction <= 1 && d.max_sleep_us >= w.min_sleep_us &&
          d.max_sleep_us <= 1e6 && d.bytes_per_sleep > 0)) {
        throw Error(
            ErrorKind::kConfig,
            fmt::format("data wait policy sleep_fraction={} max_sleep_us={} "
                        "bytes_per_sleep={}: need 0 < sleep_fraction <= 1, min_sleep_us "
                        "({}) <= max_sleep_us <= 1e6 and bytes_per_sleep > 0",
                        d.sleep_fraction, d.max_sleep_us, d.bytes_per_sleep, w.min_sleep_us));
    }
}

SleepSchedule data_sleep_schedule(const WaitPolicy& arrival, const DataWaitPolicy& data,
                                  double expected_s, double bytes_per_s) {
    double longest = data.max_sleep_us;
    if (bytes_per_s > 0)
        longest = std::min(longest, data.bytes_per_sleep / bytes_per_s * 1e6);
    const double cap = std::clamp(expected_s * 1e6 * data.sleep_fraction, arrival.min_sleep_us,
                                  std::max(longest, arrival.min_sleep_us));
    return SleepSchedule{arrival.spin_us, arrival.min_sleep_us, cap};
}

// ---- AllToAllLayout ----

AllToAllLayout AllToAllLayout::packed(std::vector<int64_t> send_counts,
                                      std::vector<int64_t> recv_counts) {
    AllToAllLayout layout;
    auto prefix = [](const std::vector<int64_t>& counts) {
        std::vector<int64_t> offsets(counts.size());
        int64_t at = 0;
        for (size_t p = 0; p < counts.size(); ++p) {
            offsets[p] = at;
            at += counts[p];
        }
        return offsets;
    };
    layout.send_offsets = prefix(send_counts);
    layout.recv_offsets = prefix(recv_counts);
    layout.send_counts = std::move(send_counts);
    layout.recv_counts = std::move(recv_counts);
    return layout;
}

AllToAllLayout AllToAllLayout::swapped() const {
    return {recv_counts, recv_offsets, send_counts, send_offsets};
}

namespace {
int64_t extent(const std::vector<int64_t>& counts, const std::vector<int64_t>& offsets) {
    int64_t e = 0;
    for (size_t p = 0; p < counts.size() && p < offsets.size(); ++p) {
        if (counts[p] > 0)
            e = std::max(e, offsets[p] + counts[p]);
    }
    return e;
}
}  // namespace

int64_t AllToAllLayout::send_extent() const {
    return extent(send_counts, send_offsets);
}
int64_t AllToAllLayout::recv_extent() const {
    return extent(recv_counts, recv_offsets);
}

void CommStats::add(const OpStats& op) {
    ++num_ops;
    bytes += op.bytes;
    data_s += op.data_s;
    data_tests += op.data_tests;
    duration_s += op.duration_s;
    arrival_wait_s += op.arrival_wait_s;
    link_hold_s += op.link_hold_s;
}

// ---- Communicator: lifetime ----

Communicator::Communicator(MPI_Comm comm, std::string name, Members members, CommOptions options,
                           std::shared_ptr<Watchdog> watchdog)
    : comm_(comm),
      name_(std::move(name)),
      members_(std::move(members)),
      options_(options),
      watchdog_(std::move(watchdog)) {
    validate_comm_options(options_);
    EPO_CHECK(watchdog_ != nullptr, "communicator {} needs a watchdog", name_);
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    EPO_CHECK_EQ(members_.world_ranks.size(), static_cast<size_t>(size_));
    EPO_CHECK_EQ(members_.nodes.size(), static_cast<size_t>(size_));
    bells_ = std::make_unique<Doorbells>(comm_);
}

Communicator::Communicator(Communicator&& o) noexcept
    : comm_(o.comm_),
      name_(std::move(o.name_)),
      members_(std::move(o.members_)),
      options_(o.options_),
      watchdog_(std::move(o.watchdog_)),
      bells_(std::move(o.bells_)),
      rank_(o.rank_),
      size_(o.size_),
      next_seq_(o.next_seq_),
      broken_(std::move(o.broken_)),
      stats_(o.stats_),
      item_types_(std::move(o.item_types_)),
      rate_(o.rate_) {
    o.comm_ = MPI_COMM_NULL;
    o.item_types_.clear();
}

Communicator::~Communicator() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return;
    for (auto& [bytes, type] : item_types_)
        MPI_Type_free(&type);
    if (comm_ != MPI_COMM_NULL)
        MPI_Comm_free(&comm_);
}

MPI_Datatype Communicator::item_type(size_t elem_bytes) {
    auto it = item_types_.find(elem_bytes);
    if (it != item_types_.end())
        return it->second;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    check_mpi(
        MPI_Type_contiguous(detail::to_int(static_cast<int64_t>(elem_bytes), "item size in bytes"),
                            MPI_BYTE, &type),
        "MPI_Type_contiguous");
    check_mpi(MPI_Type_commit(&type), "MPI_Type_commit");
    item_types_.emplace(elem_bytes, type);
    return type;
}

}  // namespace epo::comm
