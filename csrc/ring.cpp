// See NOTE [ Prefetch ring protocol ] in ring.h.
#include "ring.h"
#include "xxh3.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace fastfeed {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t elapsed_ns(Clock::time_point since) {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - since).count());
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t next_pow2(size_t n) {
    size_t p = Ring::kAlign;
    while (p < n) p <<= 1;
    return p;
}

// Closes a descriptor that was opened for one read only (past the fd cache limit).
struct FdGuard {
    int fd;
    bool owned;
    ~FdGuard() {
        if (owned && fd >= 0) ::close(fd);
    }
};

}  // namespace

void Ring::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

Ring::Buffer Ring::allocate(size_t bytes) {
    // 2 MiB alignment lets large buffers use transparent huge pages (fewer faults and TLB misses).
    const size_t align = bytes >= (size_t{8} << 20) ? (size_t{2} << 20) : kAlign;
    void* p = std::aligned_alloc(align, round_up(std::max<size_t>(bytes, 1), align));
    if (!p) throw std::bad_alloc();
    return Buffer(static_cast<uint8_t*>(p));
}

Ring::Ring(std::vector<std::string> paths, std::vector<int32_t> file_index, std::vector<int64_t> offset,
           std::vector<int64_t> size, const RingConfig& config, std::vector<int64_t> digest_at,
           std::vector<int64_t> digest_size)
    : paths_(std::move(paths)),
      file_index_(std::move(file_index)),
      offset_(std::move(offset)),
      size_(std::move(size)),
      digest_at_(std::move(digest_at)),
      digest_size_(std::move(digest_size)),
      config_(config),
      owner_pid_(::getpid()) {
    if (config_.batch_size == 0) throw std::invalid_argument("batch_size must be >= 1");
    if (config_.num_threads == 0) throw std::invalid_argument("num_threads must be >= 1");
    if (config_.num_slots == 0) throw std::invalid_argument("num_slots must be >= 1");
    if (config_.slot_bytes == 0) throw std::invalid_argument("slot_bytes must be >= 1");
    const size_t n = size_.size();
    if (file_index_.size() != n || offset_.size() != n)
        throw std::invalid_argument("file_index, offset and size must have the same length");
    for (size_t i = 0; i < n; ++i) {
        if (file_index_[i] < 0 || static_cast<size_t>(file_index_[i]) >= paths_.size())
            throw std::invalid_argument("file_index[" + std::to_string(i) + "] is out of range");
        if (offset_[i] < 0 || size_[i] < 0)
            throw std::invalid_argument("offset and size must be >= 0 (sample " + std::to_string(i) + ")");
    }
    if (digest_at_.size() != digest_size_.size() || (!digest_at_.empty() && digest_at_.size() != n))
        throw std::invalid_argument("digest_at and digest_size must both be empty or have one entry per sample");
    for (size_t i = 0; i < digest_at_.size(); ++i)
        if (digest_at_[i] < 0 || digest_size_[i] < 0 || digest_at_[i] > size_[i] - digest_size_[i])
            throw std::invalid_argument("the digest window of sample " + std::to_string(i) + " is not inside its read");
    config_.slot_bytes = round_up(config_.slot_bytes, kAlign);
    arena_bytes_ = config_.slot_bytes * config_.num_slots;
    arena_ = allocate(arena_bytes_);
    // Not touched here: the producers fault each slot in as they first fill it (see "Arena memory" in the NOTE).
    // Huge pages make that one fault per 2 MiB where the kernel allows them.
#ifdef MADV_HUGEPAGE
    ::madvise(arena_.get(), arena_bytes_, MADV_HUGEPAGE);
#endif
    slots_.resize(config_.num_slots);

    fds_.reset(new std::atomic<int>[paths_.size()]);
    for (size_t i = 0; i < paths_.size(); ++i) fds_[i].store(-1);
    struct rlimit lim {};
    size_t soft = 1024;
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) soft = lim.rlim_cur;
    max_cached_fds_ = std::min<size_t>(soft / 4, 4096);

    threads_ = std::make_unique<std::vector<std::thread>>();
    try {
        for (size_t t = 0; t < config_.num_threads; ++t) threads_->emplace_back([this] { worker_loop(); });
    } catch (...) {
        stop();
        throw;
    }
}

Ring::~Ring() {
    if (!owned_by_this_process()) {
        // See "Fork" in the NOTE: never touch the inherited threads or synchronisation objects.
        (void)threads_.release();
        return;
    }
    stop();
    for (size_t i = 0; i < paths_.size(); ++i) {
        int fd = fds_[i].load();
        if (fd >= 0) ::close(fd);
    }
}

bool Ring::owned_by_this_process() const { return ::getpid() == owner_pid_; }

void Ring::stop() {
    if (!owned_by_this_process()) return;
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    work_cv_.notify_all();
    ready_cv_.notify_all();
    idle_cv_.notify_all();
    std::lock_guard<std::mutex> join_lock(join_mu_);
    for (auto& t : *threads_)
        if (t.joinable()) t.join();
}

void Ring::check_order(const std::vector<int64_t>& order) const {
    const int64_t n = static_cast<int64_t>(size_.size());
    for (int64_t i : order)
        if (i < 0 || i >= n) throw std::out_of_range("sample index " + std::to_string(i) + " is out of range");
}

static int64_t batches_in(size_t samples, size_t batch_size) {
    return static_cast<int64_t>((samples + batch_size - 1) / batch_size);
}

void Ring::start(std::vector<int64_t> order) {
    check_order(order);
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_) throw std::runtime_error("the ring is closed");
    resetting_ = true;
    idle_cv_.wait(lock, [this] { return in_flight_ == 0 || stop_; });
    resetting_ = false;
    if (stop_) throw std::runtime_error("the ring is closed");
    for (auto& s : slots_)
        if (s.state == Slot::Filling || s.state == Slot::Ready) {
            s.state = Slot::Free;
            ++s.ticket;
        }
    epochs_.clear();
    num_batches_ = batches_in(order.size(), config_.batch_size);
    epochs_.push_back(Epoch{0, num_batches_, std::move(order)});
    assign_batch_ = 0;
    consume_batch_ = 0;
    started_ = true;
    lock.unlock();
    work_cv_.notify_all();
    ready_cv_.notify_all();
}

void Ring::extend(std::vector<int64_t> order) {
    check_order(order);
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) throw std::runtime_error("the ring is closed");
        if (!started_) throw std::logic_error("extend() needs an epoch started with start()");
        // Epochs whose batches were all claimed: their indices are copied into the slots (claim_locked).
        while (!epochs_.empty() && epochs_.front().first_batch + epochs_.front().num_batches <= assign_batch_)
            epochs_.pop_front();
        const int64_t count = batches_in(order.size(), config_.batch_size);
        epochs_.push_back(Epoch{num_batches_, count, std::move(order)});
        num_batches_ += count;
    }
    work_cv_.notify_all();
    ready_cv_.notify_all();
}

void Ring::claim_locked(Slot& s, int64_t batch) {
    // The queued epoch holding `batch` (one or two are queued; a claimed one is dropped only after its last batch).
    const Epoch* epoch = &epochs_.front();
    for (const Epoch& e : epochs_)
        if (batch >= e.first_batch) epoch = &e;
    const int64_t position = batch - epoch->first_batch;
    const size_t begin = static_cast<size_t>(position) * config_.batch_size;
    const size_t count = std::min(config_.batch_size, epoch->order.size() - begin);
    s.indices.assign(epoch->order.begin() + begin, epoch->order.begin() + begin + count);
    s.offsets.resize(count);
    s.sizes.resize(count);
    if (config_.digests) s.digests.resize(count);
    size_t total = 0;
    for (size_t k = 0; k < count; ++k) {
        s.offsets[k] = static_cast<int64_t>(total);
        s.sizes[k] = size_[static_cast<size_t>(s.indices[k])];
        total += static_cast<size_t>(s.sizes[k]);
    }
    s.nbytes = total;
    if (total <= config_.slot_bytes) {
        s.data = arena_.get() + (&s - slots_.data()) * config_.slot_bytes;
    } else {
        if (total > s.overflow_capacity) {
            const size_t cap = next_pow2(total);
            Buffer grown = allocate(cap);
            if (s.overflow) retired_overflow_.push_back(std::move(s.overflow));
            s.overflow = std::move(grown);
            s.overflow_capacity = cap;
        }
        s.data = s.overflow.get();
        ++overflow_batches_;
    }
    // Enough chunks that every thread gets some of this batch, more than that to even out slow reads.
    const size_t want = config_.num_threads * 2;
    s.chunk_len = std::max<size_t>(1, (count + want - 1) / want);
    s.chunks_total = (count + s.chunk_len - 1) / s.chunk_len;
    s.chunks_taken = 0;
    s.chunks_done = 0;
    s.failure = ReadFailure{};
    s.batch = batch;
    s.position = position;
    ++s.ticket;
    s.state = Slot::Filling;
}

bool Ring::take_chunk_locked(Chunk& chunk) {
    if (!started_ || resetting_ || assign_batch_ >= num_batches_) return false;
    Slot& s = slots_[static_cast<size_t>(assign_batch_) % slots_.size()];
    if (s.state == Slot::Free) claim_locked(s, assign_batch_);
    if (s.state != Slot::Filling || s.batch != assign_batch_) return false;  // slot still holds batch - num_slots
    const size_t k = s.chunks_taken++;
    chunk.slot = &s;
    chunk.ticket = s.ticket;
    chunk.begin = k * s.chunk_len;
    chunk.end = std::min(chunk.begin + s.chunk_len, s.indices.size());
    if (s.chunks_taken == s.chunks_total) ++assign_batch_;
    ++in_flight_;
    return true;
}

void Ring::worker_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
        Chunk chunk{};
        work_cv_.wait(lock, [&] { return stop_ || take_chunk_locked(chunk); });
        if (stop_) return;  // take_chunk_locked is not evaluated once stop_ is set, so nothing is in flight
        lock.unlock();
        ReadFailure failure;
        uint64_t bytes = 0, digest_ns = 0;
        const auto t0 = Clock::now();
        read_chunk(chunk, failure, bytes, digest_ns);
        const uint64_t total_ns = elapsed_ns(t0);
        read_ns_.fetch_add(total_ns - std::min(total_ns, digest_ns), std::memory_order_relaxed);
        digest_ns_.fetch_add(digest_ns, std::memory_order_relaxed);
        bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
        lock.lock();
        Slot& s = *chunk.slot;
        --in_flight_;
        if (failure.position >= 0 && (s.failure.position < 0 || failure.position < s.failure.position))
            s.failure = std::move(failure);
        if (++s.chunks_done == s.chunks_total) {
            s.state = Slot::Ready;
            ready_cv_.notify_all();
        }
        if (in_flight_ == 0 && resetting_) idle_cv_.notify_all();
    }
}

int Ring::fd_for(int32_t file, bool& must_close, int& err) {
    must_close = false;
    int fd = fds_[file].load(std::memory_order_acquire);
    if (fd >= 0) return fd;
    fd = ::open(paths_[file].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err = errno;
        return -1;
    }
    if (cached_fds_.fetch_add(1) < max_cached_fds_) {
        int expected = -1;
        if (fds_[file].compare_exchange_strong(expected, fd)) return fd;
        ::close(fd);  // another thread cached this file first
        cached_fds_.fetch_sub(1);
        return expected;
    }
    cached_fds_.fetch_sub(1);
    must_close = true;
    return fd;
}

void Ring::read_chunk(const Chunk& chunk, ReadFailure& failure, uint64_t& bytes, uint64_t& digest_ns) {
    // The slot is Filling and this chunk's range is ours alone: no lock needed for its vectors or bytes.
    Slot& s = *chunk.slot;
    for (size_t k = chunk.begin; k < chunk.end; ++k) {
        const size_t i = static_cast<size_t>(s.indices[k]);
        const int32_t file = file_index_[i];
        const int64_t off = offset_[i];
        const size_t want = static_cast<size_t>(size_[i]);
        auto fail = [&](int err, std::string message) {
            failure.position = static_cast<int64_t>(k);
            failure.error.err = err;
            failure.error.message = std::move(message);
            failure.error.path = paths_[file];
            failure.error.offset = off;
            failure.error.length = static_cast<int64_t>(want);
            failure.error.sample = static_cast<int64_t>(i);
        };
        bool must_close = false;
        int err = 0;
        int fd = fd_for(file, must_close, err);
        if (fd < 0) {
            fail(err, "cannot open " + paths_[file] + ": " + std::strerror(err) + " (sample " + std::to_string(i) +
                          ", offset " + std::to_string(off) + ")");
            return;
        }
        FdGuard guard{fd, must_close};
        uint8_t* dst = s.data + s.offsets[k];
        size_t got = 0;
        while (got < want) {
            ssize_t r = ::pread(fd, dst + got, want - got, static_cast<off_t>(off + static_cast<int64_t>(got)));
            if (r < 0) {
                if (errno == EINTR) continue;
                err = errno;
                fail(err, "read failed: " + paths_[file] + " at offset " + std::to_string(off) + ": " +
                              std::strerror(err) + " (sample " + std::to_string(i) + ")");
                return;
            }
            if (r == 0) {
                fail(EIO, "short read: " + paths_[file] + " at offset " + std::to_string(off) + ": wanted " +
                              std::to_string(want) + " bytes, got " + std::to_string(got) +
                              " (file truncated?) (sample " + std::to_string(i) + ")");
                return;
            }
            got += static_cast<size_t>(r);
        }
        bytes += got;
        if (config_.digests) {
            // Right after the read: the sample (~100 KB) is still in this core's cache.
            const auto h0 = Clock::now();
            s.digests[k] = digest_at_.empty() ? xxh3_64(dst, want)
                                              : xxh3_64(dst + digest_at_[i], static_cast<size_t>(digest_size_[i]));
            digest_ns += elapsed_ns(h0);
        }
    }
}

NextStatus Ring::next(BatchView& out, double timeout_seconds) {
    const auto t0 = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    NextStatus status = NextStatus::Timeout;
    auto ready = [&] {
        if (stop_) return status = NextStatus::Closed, true;
        if (!started_) return status = NextStatus::NotStarted, true;
        if (consume_batch_ >= num_batches_) return status = NextStatus::EndOfEpoch, true;
        const Slot& s = slots_[static_cast<size_t>(consume_batch_) % slots_.size()];
        if (s.state == Slot::InUse) return status = NextStatus::AllSlotsHeld, true;
        if (s.state == Slot::Ready && s.batch == consume_batch_) return status = NextStatus::Ok, true;
        return false;
    };
    if (timeout_seconds < 0) {
        ready_cv_.wait(lock, ready);
    } else {
        const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(timeout_seconds));
        if (!ready_cv_.wait_until(lock, deadline, ready)) status = NextStatus::Timeout;
    }
    wait_ns_ += elapsed_ns(t0);
    if (status != NextStatus::Ok) return status;
    Slot& s = slots_[static_cast<size_t>(consume_batch_) % slots_.size()];
    s.state = Slot::InUse;
    ++consume_batch_;
    ++batches_;
    out.batch = s.position;
    out.slot = static_cast<uint32_t>(&s - slots_.data());
    out.ticket = s.ticket;
    out.count = s.indices.size();
    out.indices = s.indices.data();
    out.offsets = s.offsets.data();
    out.sizes = s.sizes.data();
    out.digests = config_.digests ? s.digests.data() : nullptr;
    out.data = s.data;
    out.nbytes = s.nbytes;
    out.in_arena = s.data != s.overflow.get() || !s.overflow;
    out.failed = s.failure.position >= 0;
    out.error = s.failure.error;
    return status;
}

void Ring::release(uint32_t slot, uint64_t ticket) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (slot >= slots_.size()) return;
        Slot& s = slots_[slot];
        if (s.state != Slot::InUse || s.ticket != ticket) return;
        s.state = Slot::Free;
    }
    work_cv_.notify_all();
}

RingStats Ring::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    RingStats st;
    st.bytes_read = bytes_read_.load();
    st.read_seconds = static_cast<double>(read_ns_.load()) * 1e-9;
    st.digest_seconds = static_cast<double>(digest_ns_.load()) * 1e-9;
    st.batches = batches_;
    st.wait_seconds = static_cast<double>(wait_ns_) * 1e-9;
    st.overflow_batches = overflow_batches_;
    for (const auto& s : slots_) st.overflow_bytes += s.overflow_capacity;
    return st;
}

}  // namespace fastfeed
