#include "services/coordinator/status_page.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace recfleet::coordinator {
namespace {

using ::recfleet::v1::Job;
using ::recfleet::v1::JobProgress;
using ::recfleet::v1::JobStatus;

TEST(StatusPageTest, HtmlEscapeCoversMarkupCharacters) {
  EXPECT_EQ(HtmlEscape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  EXPECT_EQ(HtmlEscape("plain"), "plain");
}

TEST(StatusPageTest, HistoryIsBoundedKeepsEndsAndReplacesRepeatedSteps) {
  ProgressHistory h;
  JobProgress p;
  for (int s = 1; s <= 5000; ++s) {
    p.set_step(s);
    p.set_loss(1.0 / s);
    h.Add(p);
    ASSERT_LE(h.points().size(), ProgressHistory::kMaxPoints);
  }
  EXPECT_EQ(h.points().front().step, 1);
  EXPECT_EQ(h.points().back().step, 5000);
  EXPECT_GT(h.points().size(), ProgressHistory::kMaxPoints / 2);
  p.set_loss(42);  // step 5000 again: replaces
  h.Add(p);
  EXPECT_EQ(h.points().back().loss, 42);
  p.set_step(10);  // older: ignored
  h.Add(p);
  EXPECT_EQ(h.points().back().step, 5000);
}

std::vector<Job> Jobs(std::map<std::string, ProgressHistory>* history) {
  Job a;
  a.set_name("jobs/ctr-nightly");
  a.mutable_spec()->set_display_name("<script>alert('x')</script>");
  (*a.mutable_spec()->mutable_labels())["team"] = "ranking & ads";
  JobStatus* st = a.mutable_status();
  st->set_state(JobStatus::RUNNING);
  st->set_reason("AllRanksStarted");
  st->set_plan_summary("dense: FSDP group 2 x 1 replicas; predicted step 110.0 ms");
  st->add_workers("w-1");
  ProgressHistory& h = (*history)[a.name()];
  for (int s = 10; s <= 300; s += 10) {
    JobProgress* p = st->mutable_progress();
    p->set_step(s);
    p->set_samples(s * 256);
    p->set_loss(0.7 - 0.001 * s);
    p->set_samples_per_second(5000 + s);
    p->set_straggler_gap(0.02);
    if (s >= 100) {
      p->set_eval_step(s / 100 * 100);
      p->set_eval_auc(0.70 + 0.0002 * s);
      p->set_eval_ne(0.9);
    }
    h.Add(*p);
  }
  Job b;
  b.set_name("jobs/queued-one");
  b.mutable_status()->set_state(JobStatus::QUEUED);
  b.mutable_status()->set_reason("Submitted");
  return {a, b};
}

TEST(StatusPageTest, ShowsEveryJobWithCurvesAndEscapesWhatUsersWrote) {
  std::map<std::string, ProgressHistory> history;
  const std::string html = RenderStatusPage(Jobs(&history), history, absl::FromUnixSeconds(0));
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(html.find("team=ranking &amp; ads"), std::string::npos);
  EXPECT_NE(html.find("2 jobs: 1 QUEUED, 1 RUNNING"), std::string::npos) << html.substr(0, 2000);
  EXPECT_NE(html.find("predicted step 110.0 ms"), std::string::npos);
  EXPECT_NE(html.find("<polyline"), std::string::npos);
  EXPECT_NE(html.find("No progress reported yet."), std::string::npos);  // the queued job
  EXPECT_NE(html.find(">0.4000<"), std::string::npos);  // last loss, beside its chart
}

// The page as a browser builds it: headless Chromium (Debian's
// chromium-headless-shell, installed by tools/setup.sh) loads the file and
// dumps its DOM.
TEST(StatusPageTest, RendersInHeadlessChromium) {
  std::map<std::string, ProgressHistory> history;
  const std::string dir = ::testing::TempDir();
  const std::string page = dir + "/status.html";
  std::ofstream(page) << RenderStatusPage(Jobs(&history), history, absl::FromUnixSeconds(0));
  const std::string cmd = absl::StrCat(
      "chromium-headless-shell --no-sandbox --disable-gpu --user-data-dir=", dir,
      "/chromium-profile --dump-dom file://", page, " 2>", dir, "/chromium.log");
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string dom;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) dom.append(buf, n);
  const int rc = pclose(f);
  ASSERT_EQ(rc, 0) << "chromium-headless-shell failed (run tools/setup.sh); see " << dir
                   << "/chromium.log";
  // What a reader sees: the jobs table, each job's section and its charts;
  // the hostile name as text, not as an element.
  EXPECT_NE(dom.find("<table id=\"jobs\">"), std::string::npos) << dom.substr(0, 1000);
  EXPECT_NE(dom.find("jobs/ctr-nightly"), std::string::npos);
  EXPECT_NE(dom.find("jobs/queued-one"), std::string::npos);
  EXPECT_NE(dom.find("<polyline"), std::string::npos);
  EXPECT_NE(dom.find("training loss"), std::string::npos);
  EXPECT_NE(dom.find("eval AUC"), std::string::npos);
  EXPECT_NE(dom.find("&lt;script&gt;"), std::string::npos);
  EXPECT_EQ(dom.find("<script"), std::string::npos);
}

}  // namespace
}  // namespace recfleet::coordinator
