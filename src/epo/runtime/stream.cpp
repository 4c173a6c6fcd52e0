#include "epo/runtime/stream.h"

#include <ctime>
#include <utility>

#include "epo/core/error.h"

namespace epo::runtime {
namespace {

// CPU time of the calling thread, in nanoseconds.
int64_t thread_cpu_ns() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

comm::ProcessGroups& StreamContext::comm() {
    if (groups_ == nullptr) {
        throw Error(ErrorKind::kInternal,
                    fmt::format("stream {} has no communicators: create it with "
                                "StreamOptions::groups to run collectives on it",
                                stream_.name()));
    }
    return *groups_;
}

// ---- Marker / Event ----

namespace detail {

void Marker::complete(std::exception_ptr failure) {
    {
        std::lock_guard lock(mutex);
        done = true;
        error = std::move(failure);
    }
    cv.notify_all();
}

std::exception_ptr Marker::wait() {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return done; });
    return error;
}

}  // namespace detail

Event::Event(std::string name) : state_(std::make_shared<State>()) {
    state_->name = std::move(name);
}

const std::string& Event::name() const {
    return state_->name;
}

std::shared_ptr<detail::Marker> Event::latest() const {
    std::lock_guard lock(state_->mutex);
    return state_->latest;
}

void Event::synchronize() const {
    if (auto marker = latest()) {
        if (auto error = marker->wait())
            std::rethrow_exception(error);
    }
}

bool Event::query() const {
    auto marker = latest();
    if (!marker)
        return true;
    std::lock_guard lock(marker->mutex);
    return marker->done;
}

// ---- Stream ----

Stream::Stream(std::string name, StreamOptions options)
    : name_(std::move(name)),
      groups_(std::move(options.groups)),
      on_failure_(std::move(options.on_failure)) {
    worker_ = std::thread([this] { run(); });
}

Stream::~Stream() {
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
        // Destroyed while an exception unwinds (the rank is failing): start nothing new, since
        // queued collectives could wait on peers until their deadline before the rank runner
        // gets to end the job. Only the task already running is waited for.
        if (std::uncaught_exceptions() > 0 && !failure_) {
            failure_ = std::make_exception_ptr(
                Error(ErrorKind::kInternal,
                      fmt::format("stream {} was destroyed while unwinding from an error; the "
                                  "work still queued on it was skipped",
                                  name_)));
        }
    }
    work_cv_.notify_all();
    worker_.join();  // the worker drains the queue before it stops
}

void Stream::push(Item item) {
    {
        std::lock_guard lock(mutex_);
        queue_.push_back(std::move(item));
        ++issued_;
    }
    work_cv_.notify_one();
}

void Stream::enqueue(std::string name, Task task) {
    push(Item{ItemKind::kTask, std::move(name), std::move(task), nullptr});
}

void Stream::record(Event& event) {
    auto marker = std::make_shared<detail::Marker>();
    {
        // The binding point: waits issued from now on refer to this record.
        std::lock_guard lock(event.state_->mutex);
        event.state_->latest = marker;
    }
    push(Item{ItemKind::kRecord, event.name(), nullptr, std::move(marker)});
}

void Stream::wait(const Event& event) {
    // Bind now, at issue time, to the most recent record: a later re-record of the same event
    // does not affect this wait (cudaStreamWaitEvent semantics).
    auto marker = event.latest();
    if (!marker)
        return;
    push(Item{ItemKind::kWait, "wait " + event.name(), nullptr, std::move(marker)});
}

void Stream::synchronize() {
    std::unique_lock lock(mutex_);
    const int64_t target = issued_;
    idle_cv_.wait(lock, [&] { return finished_ >= target; });
    if (failure_)
        std::rethrow_exception(failure_);
}

std::vector<TaskRecord> Stream::take_records() {
    std::lock_guard lock(mutex_);
    return std::exchange(records_, {});
}

StreamStats Stream::stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
}

void Stream::run() {
    std::unique_lock lock(mutex_);
    for (;;) {
        work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty())
            return;  // stop requested and everything issued has run
        Item item = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        execute(item);
        lock.lock();
        ++finished_;
        idle_cv_.notify_all();
    }
}

void Stream::execute(Item& item) {
    std::exception_ptr failure;
    {
        std::lock_guard lock(mutex_);
        failure = failure_;
    }
    if (failure) {
        // Skipped; records still complete (as failed) so no other stream waits forever.
        if (item.kind == ItemKind::kRecord)
            item.marker->complete(failure);
        return;
    }
    if (item.kind == ItemKind::kRecord) {
        item.marker->complete(nullptr);
        return;
    }
    TaskRecord rec;
    rec.name = std::move(item.name);
    rec.stream = name_;
    rec.kind = item.kind == ItemKind::kTask ? RecordKind::kTask : RecordKind::kWait;
    const comm::ByteCounts bytes_before = groups_ ? groups_->total_bytes() : comm::ByteCounts{};
    rec.start_ns = comm::to_ns(comm::Clock::now());
    if (item.kind == ItemKind::kTask) {
        const int64_t cpu_start = thread_cpu_ns();
        try {
            StreamContext context(*this, groups_.get());
            item.task(context);
        } catch (...) {
            failure = std::current_exception();
        }
        rec.cpu_ns = thread_cpu_ns() - cpu_start;
    } else {
        failure = item.marker->wait();
    }
    rec.end_ns = comm::to_ns(comm::Clock::now());
    if (groups_)
        rec.bytes = groups_->total_bytes() - bytes_before;
    {
        std::lock_guard lock(mutex_);
        const double seconds = static_cast<double>(rec.end_ns - rec.start_ns) * 1e-9;
        if (rec.kind == RecordKind::kTask) {
            ++stats_.num_tasks;
            stats_.busy_s += seconds;
        } else {
            stats_.event_wait_s += seconds;
        }
        stats_.bytes += rec.bytes;
        records_.push_back(std::move(rec));
        if (failure)
            failure_ = failure;
    }
    if (failure && on_failure_)
        on_failure_(failure);
}

}  // namespace epo::runtime
