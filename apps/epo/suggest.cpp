#include "suggest.h"

#include <algorithm>
#include <numeric>

namespace epo::cli {

int edit_distance(std::string_view a, std::string_view b) {
    // d[i][j]: distance between a[0, i) and b[0, j); three rows for the transposition step.
    const size_t m = b.size();
    std::vector<int> two_back(m + 1), previous(m + 1), row(m + 1);
    std::iota(previous.begin(), previous.end(), 0);
    for (size_t i = 1; i <= a.size(); ++i) {
        row[0] = static_cast<int>(i);
        for (size_t j = 1; j <= m; ++j) {
            row[j] = std::min({previous[j] + 1, row[j - 1] + 1,
                               previous[j - 1] + (a[i - 1] != b[j - 1] ? 1 : 0)});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                row[j] = std::min(row[j], two_back[j - 2] + 1);
        }
        two_back.swap(previous);
        previous.swap(row);
    }
    return previous[m];
}

std::optional<std::string> closest_name(std::string_view typed,
                                        const std::vector<std::string>& candidates) {
    const int limit = std::min(3, std::max(1, static_cast<int>(typed.size()) / 3));
    std::optional<std::string> best;
    int best_distance = limit + 1;
    for (const std::string& c : candidates) {
        const int d = edit_distance(typed, c);
        if (d < best_distance) {
            best_distance = d;
            best = c;
        }
    }
    return best;
}

}  // namespace epo::cli
