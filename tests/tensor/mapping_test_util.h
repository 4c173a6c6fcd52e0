// Reads /proc/self/smaps: whether the mapping holding an address may use transparent huge pages.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace epo::test {

// Whether this kernel hands out transparent huge pages to a mapping that asks for them (mode
// "always" or "madvise"; not "never", and not when the setting cannot be read).
inline bool thp_enabled() {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string mode;
    std::getline(f, mode);
    return mode.find("[always]") != std::string::npos ||
           mode.find("[madvise]") != std::string::npos;
}

// 1 or 0 from the "THPeligible:" line of the mapping that contains `p`; -1 when the kernel does
// not report it (or no mapping contains p).
inline int thp_eligible(const void* p) {
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    std::ifstream smaps("/proc/self/smaps");
    std::string line;
    bool inside = false;
    while (std::getline(smaps, line)) {
        std::uintptr_t lo = 0, hi = 0;
        char dash = 0;
        std::istringstream head(line);
        if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
            inside = lo <= addr && addr < hi;
            continue;
        }
        if (inside && line.rfind("THPeligible:", 0) == 0) {
            return std::stoi(line.substr(12));
        }
    }
    return -1;
}

}  // namespace epo::test
