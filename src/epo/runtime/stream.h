// Streams and events: the whole overlap mechanism, CUDA-like so a CUDA backend maps 1:1
// (Stream -> cudaStream_t, Event -> cudaEvent_t, collectives -> NCCL).
//
// A Stream runs the tasks issued to it in issue order on its own worker thread; issuing only
// enqueues (the issuing thread never waits for computation). Order between streams exists only
// through events: stream.record(event) marks "everything issued to this stream so far";
// other.wait(event) makes `other` wait for the most recent record issued before the wait call,
// exactly like cudaEventRecord / cudaStreamWaitEvent, also when one event is recorded alternately
// on two streams. Waiting on a never-recorded event is a no-op.
//
// Each stream owns its own communicators (comm::ProcessGroups), and a task receives those of the
// stream it runs on, so the collectives of a communicator are issued in that stream's order,
// which is the same on every rank (see process_groups.h).
//
// Failures: an exception in a task makes the stream failed (sticky): later work on it is
// skipped, its pending records complete as failed, a stream waiting on such a record fails with
// the same error, and synchronize() rethrows it. With StreamOptions::on_failure set (the rank
// streams set abort_job), the failure also ends the job at once, because peers may be blocked in
// a collective this rank will never enter.
//
// What it records: per task its name, stream, start/end and the bytes its collectives moved;
// per wait the time the stream sat blocked on the other stream (exposed communication when the
// compute stream waits on the comm stream).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "epo/comm/link_model.h"
#include "epo/comm/process_groups.h"

namespace epo::runtime {

class Stream;

// What a task gets: the stream it runs on and that stream's communicators.
class StreamContext {
public:
    StreamContext(Stream& stream, comm::ProcessGroups* groups) : stream_(stream), groups_(groups) {}
    Stream& stream() { return stream_; }
    // The stream's own communicators; raises epo::Error if the stream was created without.
    comm::ProcessGroups& comm();

private:
    Stream& stream_;
    comm::ProcessGroups* groups_;
};

using Task = std::function<void(StreamContext&)>;

enum class RecordKind { kTask, kWait };

struct TaskRecord {
    std::string name;    // task name, or "wait <event>" for an event wait
    std::string stream;  // name of the stream it ran on
    RecordKind kind = RecordKind::kTask;
    int64_t start_ns = 0;  // steady clock (CLOCK_MONOTONIC, shared by the ranks of a host)
    int64_t end_ns = 0;
    // CPU time the stream's worker thread used during the task (CLOCK_THREAD_CPUTIME_ID): on
    // CPU ranks, what a stream takes from the cores; a task that sleeps or waits uses little.
    // 0 for waits.
    int64_t cpu_ns = 0;
    comm::ByteCounts bytes;  // moved by the task's collectives (on this stream's communicators)
};

struct StreamStats {
    int64_t num_tasks = 0;
    double busy_s = 0;        // time in tasks
    double event_wait_s = 0;  // time blocked in event waits
    comm::ByteCounts bytes;
};

namespace detail {
// One record of an event: completes when the recording stream reaches it.
struct Marker {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;  // set if the recording stream failed before reaching it

    void complete(std::exception_ptr failure);
    std::exception_ptr wait();  // returns the failure, if any
};
}  // namespace detail

// A copyable handle, like cudaEvent_t: copies refer to the same event.
class Event {
public:
    explicit Event(std::string name = "event");
    const std::string& name() const;
    // Host wait for the most recent record issued (no-op if never recorded); rethrows the
    // recording stream's failure.
    void synchronize() const;
    // True if the most recent record has completed (or there is none).
    bool query() const;

private:
    friend class Stream;
    struct State {
        std::string name;
        std::mutex mutex;
        std::shared_ptr<detail::Marker> latest;
    };
    std::shared_ptr<detail::Marker> latest() const;
    std::shared_ptr<State> state_;
};

struct StreamOptions {
    // The stream's communicators (may be null: a stream without collectives).
    std::unique_ptr<comm::ProcessGroups> groups;
    // Called on the worker thread with the first failure (e.g. comm::abort_job).
    std::function<void(const std::exception_ptr&)> on_failure;
};

class Stream {
public:
    explicit Stream(std::string name, StreamOptions options = {});
    // Finishes the issued work, then stops the worker thread. When destroyed during exception
    // unwinding, skips the queued work instead (waits only for the running task).
    ~Stream();
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;

    const std::string& name() const { return name_; }

    void enqueue(std::string name, Task task);
    void record(Event& event);
    void wait(const Event& event);
    // Host wait for everything issued so far; rethrows the stream's failure, if any.
    void synchronize();

    // Records of the finished tasks and waits since the last call (call after synchronize()).
    std::vector<TaskRecord> take_records();
    StreamStats stats() const;
    // The stream's communicators, for set-up and reading statistics between tasks.
    comm::ProcessGroups* groups() { return groups_.get(); }

private:
    enum class ItemKind { kTask, kRecord, kWait };
    struct Item {
        ItemKind kind;
        std::string name;
        Task task;
        std::shared_ptr<detail::Marker> marker;
    };
    void push(Item item);
    void run();
    void execute(Item& item);

    std::string name_;
    std::unique_ptr<comm::ProcessGroups> groups_;
    std::function<void(const std::exception_ptr&)> on_failure_;

    mutable std::mutex mutex_;
    std::condition_variable work_cv_;
    std::condition_variable idle_cv_;
    std::deque<Item> queue_;
    int64_t issued_ = 0;
    int64_t finished_ = 0;
    bool stop_ = false;
    std::exception_ptr failure_;
    std::vector<TaskRecord> records_;
    StreamStats stats_;
    std::thread worker_;
};

}  // namespace epo::runtime
