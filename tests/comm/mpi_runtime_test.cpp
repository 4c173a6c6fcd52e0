// EP005's runtime form: anything below MPI_THREAD_MULTIPLE is refused with a message naming the
// rule, the granted level and the fix.
#include "epo/comm/mpi_runtime.h"

#include <gtest/gtest.h>

#include "epo/core/error.h"

namespace epo::comm {
namespace {

TEST(MpiRuntime, ThreadLevelBelowMultipleIsEP005) {
    EXPECT_NO_THROW(check_thread_level(MPI_THREAD_MULTIPLE));
    for (int level : {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED}) {
        try {
            check_thread_level(level);
            FAIL() << "no error for " << thread_level_name(level);
        } catch (const Error& e) {
            const std::string m = e.what();
            EXPECT_EQ(e.kind(), ErrorKind::kConfig);
            EXPECT_NE(m.find("EP005: the MPI library must grant MPI_THREAD_MULTIPLE for the comm "
                             "stream"),
                      std::string::npos);
            EXPECT_NE(m.find(std::string("granted ") + thread_level_name(level)),
                      std::string::npos);
        }
    }
}

TEST(MpiRuntime, KnowsTheLinkedLibrary) {
    EXPECT_NE(mpi_flavor(), MpiFlavor::kOther) << mpi_library_version();
    EXPECT_FALSE(mpi_library_version().empty());
}

}  // namespace
}  // namespace epo::comm
