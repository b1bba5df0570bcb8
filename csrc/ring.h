// Native prefetch ring: N fixed slots in one host allocation, filled by M pread worker threads, handed to one
// consumer strictly in batch order. No Python headers here (ring_bindings.cpp owns the GIL policy).
//
// NOTE [ Prefetch ring protocol ]
// --------------------------------
// Memory. One page-aligned allocation of num_slots * slot_bytes, slot s at arena + s * slot_bytes. A slot holds one
// batch: its samples' bytes back to back, plus per-sample offsets/sizes. The Python side may page-lock the arena
// (cudaHostRegister) after construction; this file never frees the arena while the owning object lives.
// A batch whose bytes exceed slot_bytes never fails: that slot *grows* a private overflow buffer (next power of two
// >= the batch) used instead of its arena range. Overflow buffers are not pinned; a replaced one is kept until the
// ring is destroyed, so a stale view can read stale bytes but never freed memory.
//
// Ordering. Batch b (numbered on across the epochs queued, see Epochs) always lives in slot b % num_slots.
// Producers start filling batch b only after batch b - num_slots was released; the consumer takes batch b only after
// it is complete. So batches come out in the order asked for whatever the thread count, and the consumer can be at
// most num_slots batches behind.
//
// Slot lifecycle (all transitions under mu_):
//     Free --(a producer claims batch b: lays out offsets, picks arena/overflow memory)--> Filling
//     Filling --(the last of its chunks is read by whichever producers took them)--> Ready
//     Ready --(consumer's next() for batch b)--> InUse
//     InUse --(consumer's release(slot, ticket))--> Free
// A slot is reused only after its consumer is done: nothing writes into an InUse slot, and only release() leaves
// InUse. The ticket (bumped at every claim) makes a late or double release of an older batch a no-op.
//
// Parallel fan-out. A batch is split into chunks of consecutive samples; producers take chunks of the oldest batch
// with chunks left, then claim the next batch, so a single batch is read by all threads at once (many reads in
// flight for cold storage) and up to num_slots batches are being filled. Readers never hold mu_ while in pread.
//
// Digests. With RingConfig::digests the reader thread that read a sample computes its XXH3_64bits (seed 0, the
// pack's per-sample checksum) right after the read, while the bytes are still in its cache, into the slot's
// digests[k] (its own chunk's range, like the bytes). So the consumer compares 8 bytes per sample instead of
// hashing the batch in Python (~5 us per 117 KB sample in python-xxhash, and a GIL hand-over per sample). Overflow
// batches get them too; a failed sample's digest is left stale (its batch is failed and released unseen, see
// Errors). A digest window narrows it to part of each read: a webdataset sample read with its text or JSON members
// is one extent, and the stored checksum is the image member's alone.
//
// Errors. A failed or short read is recorded on the slot (the lowest failing sample wins, so the message is
// deterministic); the batch still completes and the consumer receives it with `failed` set, then releases it and
// goes on with the next batch. The ring itself stays usable.
//
// Epochs. start(order) may be called at any time: it waits for chunks in flight (bounded by one pread each), drops
// Filling/Ready slots of the abandoned epoch, and leaves InUse slots alone until the consumer releases them.
// extend(order) queues the next epoch behind the current one instead: its batches are numbered on from the last
// queued batch (the slot rule above holds across the boundary), so the producers read into it as slots free up and
// the consumer takes its first batch right after the previous epoch's last, with nothing dropped or waited for. An
// epoch's last batch may be short; the next epoch starts a new batch. BatchView::batch stays the position within the
// batch's own epoch. Queued epochs whose batches are all claimed are dropped at the next extend().
//
// Shutdown. stop() sets stop_, wakes every waiter (producers waiting for a free slot, a consumer waiting for a ready
// batch in another thread) and joins the producers; it is idempotent and safe from any thread. Every wait is on a
// condition variable that stop_ breaks, and a producer finishes at most one chunk after stop_, so join is prompt.
//
// Arena memory is never zero-filled by us, and not touched by the constructor. Nothing depends on zeroed bytes: the
// consumer sees exactly [0, nbytes) of a batch, every byte of which a producer wrote before the slot became Ready;
// a failed batch is released by the binding's caller before any view of it exists (ring.py), and the slack past
// nbytes is never exposed. The producers fault each slot in during its first fill (the first num_slots batches),
// spread over the reader threads and overlapped with the consumer: the arena is sized by the data (~12 GB for a
// ring of 12-MP photos), and touching it all in the constructor would hold back the first batch for seconds.
// The binding still runs the constructor with the GIL released (the allocation itself may take a while).
//
// Fork. A child process inherits the memory of the ring but not its threads; its mutexes and condition variables
// may be mid-use by threads that no longer exist. The owning pid is recorded; in any other process stop() and the
// destructor touch none of them and deliberately leak the threads' handles (destroying a condition variable that
// "has waiters" can block forever in glibc). The Python wrapper refuses to use a ring in a forked child.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fastfeed {

struct RingConfig {
    size_t batch_size = 0;
    size_t num_threads = 1;
    size_t num_slots = 2;
    size_t slot_bytes = 0;  // rounded up to a multiple of kAlign
    bool digests = false;   // XXH3_64bits of every sample, by the reader threads (see "Digests" in the NOTE)
};

struct RingStats {
    uint64_t bytes_read = 0;
    double read_seconds = 0;   // summed over producer threads (pread only)
    double digest_seconds = 0; // summed over producer threads: hashing for RingConfig::digests
    uint64_t batches = 0;      // handed to the consumer
    double wait_seconds = 0;   // consumer time blocked in next()
    uint64_t overflow_batches = 0;
    uint64_t overflow_bytes = 0;  // currently held by grown slots
};

// Why a batch failed: the lowest failing sample of the batch (so the report is deterministic).
struct ReadError {
    int64_t sample = -1;   // dataset index of the sample
    std::string path;      // the file it lives in
    int64_t offset = -1;   // its byte offset in that file
    int64_t length = -1;   // its byte length
    int err = 0;           // errno (EIO for a short read)
    std::string message;   // names file, offset and sample
};

// What next() hands to the consumer. Pointers stay valid until release(slot, ticket).
struct BatchView {
    int64_t batch = -1;  // position within its epoch (start() or extend() order)
    uint32_t slot = 0;
    uint64_t ticket = 0;
    size_t count = 0;
    const int64_t* indices = nullptr;
    const int64_t* offsets = nullptr;
    const int64_t* sizes = nullptr;
    const uint64_t* digests = nullptr;  // XXH3_64bits per sample; null unless RingConfig::digests
    uint8_t* data = nullptr;
    size_t nbytes = 0;
    bool in_arena = true;  // false when the batch sits in the slot's (unpinned) overflow buffer
    bool failed = false;
    ReadError error;  // meaningful when failed
};

enum class NextStatus { Ok, EndOfEpoch, Timeout, Closed, NotStarted, AllSlotsHeld };

class Ring {
public:
    static constexpr size_t kAlign = 4096;

    // extents: sample i lives in paths[file_index[i]] at [offset[i], offset[i] + size[i]). With config.digests,
    // digest_at/digest_size (both empty, or one per sample) narrow sample i's digest to bytes
    // [digest_at[i], digest_at[i] + digest_size[i]) of its read; empty: the whole read.
    Ring(std::vector<std::string> paths, std::vector<int32_t> file_index, std::vector<int64_t> offset,
         std::vector<int64_t> size, const RingConfig& config, std::vector<int64_t> digest_at = {},
         std::vector<int64_t> digest_size = {});
    ~Ring();
    Ring(const Ring&) = delete;
    Ring& operator=(const Ring&) = delete;

    void start(std::vector<int64_t> order);
    // Queue the next epoch's order behind the ones queued (see "Epochs" in the NOTE); start() must have been called.
    void extend(std::vector<int64_t> order);
    // timeout_seconds < 0 waits until a batch is ready, the epoch ends or stop().
    NextStatus next(BatchView& out, double timeout_seconds);
    void release(uint32_t slot, uint64_t ticket);
    void stop();

    RingStats stats() const;
    uint8_t* arena() const { return arena_.get(); }
    size_t arena_bytes() const { return arena_bytes_; }
    size_t slot_bytes() const { return config_.slot_bytes; }
    size_t num_slots() const { return config_.num_slots; }
    size_t num_samples() const { return size_.size(); }
    bool owned_by_this_process() const;

private:
    struct FreeDeleter {
        void operator()(uint8_t* p) const;
    };
    using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

    struct ReadFailure {
        int64_t position = -1;  // sample position within the batch; lowest wins
        ReadError error;
    };

    struct Slot {
        enum State { Free, Filling, Ready, InUse } state = Free;
        uint64_t ticket = 0;
        int64_t batch = -1;     // over all queued epochs (the slot rule's number)
        int64_t position = -1;  // within its epoch
        std::vector<int64_t> indices, offsets, sizes;
        std::vector<uint64_t> digests;  // empty unless config_.digests
        uint8_t* data = nullptr;
        size_t nbytes = 0;
        Buffer overflow;
        size_t overflow_capacity = 0;
        size_t chunk_len = 1, chunks_total = 0, chunks_taken = 0, chunks_done = 0;
        ReadFailure failure;
    };

    struct Chunk {
        Slot* slot;
        uint64_t ticket;
        size_t begin, end;
    };

    void worker_loop();
    bool take_chunk_locked(Chunk& chunk);
    void claim_locked(Slot& slot, int64_t batch);
    void read_chunk(const Chunk& chunk, ReadFailure& failure, uint64_t& bytes, uint64_t& digest_ns);
    int fd_for(int32_t file, bool& must_close, int& err);
    static Buffer allocate(size_t bytes);

    std::vector<std::string> paths_;
    std::vector<int32_t> file_index_;
    std::vector<int64_t> offset_, size_;
    std::vector<int64_t> digest_at_, digest_size_;  // empty: digests cover the whole read
    RingConfig config_;
    pid_t owner_pid_;

    Buffer arena_;
    size_t arena_bytes_ = 0;
    std::vector<Slot> slots_;
    std::vector<Buffer> retired_overflow_;

    // fd cache: one descriptor per file, opened on first use and kept until destruction; past max_cached_fds_
    // (an ImageFolder of a million files) a file is opened per read instead of exhausting RLIMIT_NOFILE.
    std::unique_ptr<std::atomic<int>[]> fds_;
    std::atomic<size_t> cached_fds_{0};
    size_t max_cached_fds_ = 0;

    mutable std::mutex mu_;
    std::condition_variable work_cv_;   // producers: a slot became free, a new epoch, stop
    std::condition_variable ready_cv_;  // consumer: a batch became ready, stop
    std::condition_variable idle_cv_;   // start(): the last chunk in flight finished
    // One queued epoch: its order, batched from first_batch on.
    struct Epoch {
        int64_t first_batch = 0;
        int64_t num_batches = 0;
        std::vector<int64_t> order;
    };
    void check_order(const std::vector<int64_t>& order) const;
    std::deque<Epoch> epochs_;   // start() leaves one, extend() appends
    int64_t num_batches_ = 0;    // batches queued over all epochs
    int64_t assign_batch_ = 0;   // oldest batch with chunks not yet taken
    int64_t consume_batch_ = 0;  // next batch for the consumer
    size_t in_flight_ = 0;       // chunks being read right now
    bool started_ = false;
    bool resetting_ = false;
    bool stop_ = false;

    std::mutex join_mu_;  // only one caller of stop() joins
    std::unique_ptr<std::vector<std::thread>> threads_;

    std::atomic<uint64_t> bytes_read_{0};
    std::atomic<uint64_t> read_ns_{0};
    std::atomic<uint64_t> digest_ns_{0};
    uint64_t batches_ = 0;
    uint64_t wait_ns_ = 0;
    uint64_t overflow_batches_ = 0;
};

}  // namespace fastfeed
