/* The guard of guard.py, in C (issue 24): the same containment and the same wire format, at about
 * 1 MB of RSS instead of a second Python interpreter's 10. guard.py's docstring is the contract;
 * docs/guard.md says how this binary is built and chosen. Linux only.
 *
 * Usage: guard PARENT_PID SOCKET_FD   (started by guard_client.py, as guard.py is)
 *        guard --version              (prints "aggregator-guard HASH": the build checks it runs)
 *
 * Wire format, both directions: one SOCK_SEQPACKET message is a run of fields, each a tag byte, its
 * value and a NUL. Aggregator -> guard: `i` id (decimal), `a` each word of argv (at least one), `e`
 * each NAME=value of the environment, `c` the working directory (optional), with the three
 * descriptors (stdin, stdout, stderr) as SCM_RIGHTS. Guard -> aggregator: `i` id then `p` pid, or
 * `i` id then `r` the reason it was refused (no `i` when the id itself was unreadable), and `x` pid
 * then `c` exit code (128 + signal when a signal ended it).
 *
 * Every length is bounded by the received message; a malformed one is answered with a refusal and
 * its descriptors closed; nothing in it can make the guard exit or leak a process. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef GUARD_SOURCE_HASH
#define GUARD_SOURCE_HASH "unknown"
#endif

#define MARKER "AGGREGATOR_GUARD_UPSTREAM"
#define MAX_MESSAGE (4 * 1024 * 1024) /* as guard.py */
#define MAX_FDS 16                     /* more are closed on receipt */
#define MAX_ID 18                      /* digits: fits an int64 */
#define MAX_ENVIRON (16 * 1024 * 1024) /* of a process read from /proc */
#define TERM_GRACE_MS 500              /* as guard.py: below the aggregator's own grace */
#define KILL_WAIT_MS 1000

static char message[MAX_MESSAGE]; /* bss: only the pages a message touches become resident */
static int sock = -1;

struct leader {
    pid_t pid;
    char id[MAX_ID + 1];
};
static struct leader *leaders;
static size_t n_leaders, cap_leaders;

struct ending {
    long long deadline; /* ms, CLOCK_MONOTONIC */
    pid_t *pids;
    size_t n;
};
static struct ending *endings;
static size_t n_endings, cap_endings;

struct proc {
    pid_t pid, ppid, sid;
    char state; /* 'Z': a zombie, which can neither fork nor be ended again */
};

struct pids {
    pid_t *at;
    size_t n, cap;
};

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Grow an array to hold one more item; 0 when memory is short (the caller skips the item). */
static int grow(void **items, size_t *cap, size_t n, size_t size) {
    if (n < *cap) return 1;
    size_t more = *cap ? *cap * 2 : 16;
    if (more > ((size_t)-1) / size) return 0;
    void *bigger = realloc(*items, more * size);
    if (bigger == NULL) return 0;
    *items = bigger;
    *cap = more;
    return 1;
}

static void pids_add(struct pids *list, pid_t pid) {
    if (grow((void **)&list->at, &list->cap, list->n, sizeof(pid_t))) list->at[list->n++] = pid;
}

/* ---------------------------------------------------------------- answers */

/* One answer: the field `tag1 value1` (left out when value1 is NULL), then `tag2 value2`. A reason too
 * long for the buffer is cut; the aggregator may be gone, which the main loop reads as end-of-file
 * next (MSG_NOSIGNAL: no SIGPIPE). */
static void answer(char tag1, const char *value1, char tag2, const char *value2) {
    char text[512];
    int len = value1 != NULL ? snprintf(text, sizeof text, "%c%s%c%c%s", tag1, value1, 0, tag2, value2)
                             : snprintf(text, sizeof text, "%c%s", tag2, value2);
    if (len < 0) return;
    if ((size_t)len >= sizeof text) len = sizeof text - 1;
    text[len++] = 0;
    while (send(sock, text, (size_t)len, MSG_NOSIGNAL) < 0 && errno == EINTR) {
    }
}

/* ---------------------------------------------------------------- the request */

struct request {
    const char *id;
    const char *cwd;
    char **argv; /* NULL-terminated, pointing into the message */
    char **envp; /* NULL-terminated, the marker last */
    char marker[sizeof MARKER + 1 + MAX_ID + 1];
};

static int valid_id(const char *value) {
    size_t len = strlen(value);
    if (len == 0 || len > MAX_ID) return 0;
    for (size_t i = 0; i < len; i++)
        if (value[i] < '0' || value[i] > '9') return 0;
    return 1;
}

static int is_marker(const char *entry) {
    return strncmp(entry, MARKER "=", sizeof MARKER) == 0;
}

/* Parse `len` bytes of `data` into `req`; NULL, or why not. req->id is set as soon as it is known. */
static const char *parse_request(char *data, size_t len, struct request *req) {
    size_t argc = 0, envc = 0, ids = 0, cwds = 0, empty = 0, unknown = 0;
    memset(req, 0, sizeof *req);
    if (len == 0 || data[len - 1] != 0) return "ValueError: a message ends with a NUL";
    for (char *field = data; field < data + len; field += strlen(field) + 1) {
        switch (field[0]) { /* count everything first: a refusal names the id wherever it stands */
        case 'i':
            if (ids++ == 0 && valid_id(field + 1)) req->id = field + 1;
            break;
        case 'a': argc++; break;
        case 'e': envc++; break;
        case 'c': cwds++; break;
        case 0: empty++; break;
        default: unknown++; break;
        }
    }
    if (empty) return "ValueError: an empty field";
    if (unknown) return "ValueError: an unknown field";
    if (ids != 1 || req->id == NULL) {
        req->id = NULL;
        return "ValueError: a spawn request needs one decimal id";
    }
    if (argc == 0) return "ValueError: a spawn request needs argv and three descriptors";
    if (cwds > 1) return "ValueError: more than one working directory";
    /* counts are below len <= MAX_MESSAGE: no overflow */
    req->argv = calloc(argc + 1, sizeof(char *));
    req->envp = calloc(envc + 2, sizeof(char *));
    if (req->argv == NULL || req->envp == NULL) return "MemoryError: the request is too large";
    size_t a = 0, e = 0;
    for (char *field = data; field < data + len; field += strlen(field) + 1) {
        char *value = field + 1;
        if (field[0] == 'a')
            req->argv[a++] = value;
        else if (field[0] == 'c')
            req->cwd = value;
        else if (field[0] == 'e') {
            char *equals = strchr(value, '=');
            if (equals == NULL || equals == value) return "ValueError: an environment entry is not NAME=value";
            if (!is_marker(value)) req->envp[e++] = value;
        }
    }
    snprintf(req->marker, sizeof req->marker, "%s=%s", MARKER, req->id);
    req->envp[e] = req->marker;
    return NULL;
}

static void free_request(struct request *req) {
    free(req->argv);
    free(req->envp);
    req->argv = req->envp = NULL;
}

/* ---------------------------------------------------------------- /proc */

static int read_stat(pid_t pid, char *state, pid_t *ppid, pid_t *sid) {
    char path[64], stat[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t got = read(fd, stat, sizeof stat - 1);
    close(fd);
    if (got <= 0) return 0;
    stat[got] = 0;
    char *close_paren = strrchr(stat, ')'); /* the name may hold anything, even ')' */
    int p, s;
    if (close_paren == NULL || sscanf(close_paren + 1, " %c %d %*d %d", state, &p, &s) != 3) return 0;
    *ppid = p;
    *sid = s;
    return 1;
}

/* Every process with its parent and session; the count in *n (caller frees). */
static struct proc *processes(size_t *n) {
    struct proc *all = NULL;
    size_t cap = 0;
    *n = 0;
    DIR *dir = opendir("/proc");
    if (dir == NULL) return NULL;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        char *end;
        long pid = strtol(entry->d_name, &end, 10);
        if (*end != 0 || pid <= 0) continue;
        struct proc item = {(pid_t)pid, 0, 0, 0};
        if (!read_stat(item.pid, &item.state, &item.ppid, &item.sid)) continue;
        if (grow((void **)&all, &cap, *n, sizeof *all)) all[(*n)++] = item;
    }
    closedir(dir);
    return all;
}

/* Every process below `root` (parents before children), added to `out`. */
static void descendants(pid_t root, const struct proc *all, size_t n, struct pids *out) {
    size_t start = out->n;
    for (size_t i = 0; i < n; i++)
        if (all[i].ppid == root) pids_add(out, all[i].pid);
    for (size_t next = start; next < out->n; next++) /* out grows as it is walked: breadth first */
        for (size_t i = 0; i < n; i++)
            if (all[i].ppid == out->at[next] && all[i].pid != root) pids_add(out, all[i].pid);
}

static int pids_has(const struct pids *list, pid_t pid) {
    for (size_t i = 0; i < list->n; i++)
        if (list->at[i] == pid) return 1;
    return 0;
}

static void kill_all(const struct pids *list, int sig) {
    for (size_t i = 0; i < list->n; i++) kill(list->at[i], sig);
}

/* The marker's values in a process's environment match a live upstream's id? */
static int marked_by_leader(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    size_t len = 0, cap = 0;
    char *text = NULL;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            if (cap >= MAX_ENVIRON) break;
            size_t more = cap ? cap * 2 : 8192;
            char *bigger = realloc(text, more);
            if (bigger == NULL) break;
            text = bigger;
            cap = more;
        }
        ssize_t got = read(fd, text + len, cap - len - 1);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        len += (size_t)got;
    }
    close(fd);
    int found = 0;
    if (text != NULL) {
        text[len] = 0;
        for (char *entry = text; entry < text + len && !found; entry += strlen(entry) + 1)
            if (is_marker(entry))
                for (size_t i = 0; i < n_leaders && !found; i++)
                    found = strcmp(entry + sizeof MARKER, leaders[i].id) == 0;
    }
    free(text);
    return found;
}

static int is_leader(pid_t pid) {
    for (size_t i = 0; i < n_leaders; i++)
        if (leaders[i].pid == pid) return 1;
    return 0;
}

/* ---------------------------------------------------------------- spawning */

/* Run argv[0] as os.execvpe does (what guard.py runs, and what users had before this guard): a name
 * with a slash as it is, else each directory of the environment's last PATH in turn (os.defpath without
 * one; an empty entry is the working directory). Unlike execvp, a file the kernel cannot execute (a
 * script without "#!") is not handed to /bin/sh. Returns only on failure: errno is the first error
 * other than "not found", else the last one. */
static void exec_search(char **argv, char **envp) {
    const char *file = argv[0], *path = "/bin:/usr/bin";
    if (strchr(file, '/') != NULL) {
        execve(file, argv, envp);
        return;
    }
    for (char **entry = envp; *entry != NULL; entry++)
        if (strncmp(*entry, "PATH=", 5) == 0) path = *entry + 5; /* the last one: os.execvpe's dict */
    int saved = 0, last = ENOENT;
    for (const char *dir = path;; dir++) {
        const char *end = strchrnul(dir, ':');
        char full[4096];
        int len = end == dir ? snprintf(full, sizeof full, "%s", file)
                             : snprintf(full, sizeof full, "%.*s/%s", (int)(end - dir), dir, file);
        if (len < 0 || (size_t)len >= sizeof full)
            errno = ENAMETOOLONG;
        else
            execve(full, argv, envp);
        last = errno;
        if (saved == 0 && errno != ENOENT && errno != ENOTDIR) saved = errno;
        if (*end == 0) break;
        dir = end;
    }
    errno = saved != 0 ? saved : last;
}

/* In the forked child: become the upstream (never returns). */
static void exec_upstream(struct request *req, int fds[3], pid_t guard) {
    static const int reset[] = {SIGTERM, SIGINT, SIGHUP, SIGCHLD, SIGPIPE, SIGXFSZ};
    for (size_t i = 0; i < sizeof reset / sizeof reset[0]; i++) signal(reset[i], SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (setsid() < 0) goto fail;
    for (int i = 0; i < 3; i++) /* above 2 first, so no dup2 below overwrites a descriptor still to come */
        if (fds[i] < 3 && (fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3)) < 0) goto fail;
    for (int i = 0; i < 3; i++)
        if (dup2(fds[i], i) < 0) goto fail;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) goto fail;
    if (getppid() != guard) _exit(127); /* the guard died before the line above */
    if (req->cwd != NULL && chdir(req->cwd) != 0) goto fail;
    exec_search(req->argv, req->envp);
fail:
    dprintf(2, "aggregator-guard: cannot run %s: %s\n", req->argv[0], strerror(errno));
    _exit(127);
}

static void spawn(struct request *req, int fds[3]) {
    if (!grow((void **)&leaders, &cap_leaders, n_leaders, sizeof *leaders)) {
        answer('i', req->id, 'r', "MemoryError: too many upstreams");
        return;
    }
    pid_t guard = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        char reason[128];
        snprintf(reason, sizeof reason, "OSError: fork: %s", strerror(errno));
        answer('i', req->id, 'r', reason);
        return;
    }
    if (pid == 0) exec_upstream(req, fds, guard);
    leaders[n_leaders].pid = pid;
    snprintf(leaders[n_leaders].id, sizeof leaders[n_leaders].id, "%s", req->id);
    n_leaders++;
    char number[24];
    snprintf(number, sizeof number, "%d", (int)pid);
    answer('i', req->id, 'p', number);
}

/* One message from the aggregator; 0 at end-of-file (or a socket error: the same, as guard.py). */
static int handle_message(void) {
    union {
        struct cmsghdr align;
        char space[CMSG_SPACE(MAX_FDS * sizeof(int))];
    } control;
    struct iovec iov = {message, sizeof message};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.space;
    msg.msg_controllen = sizeof control.space;
    ssize_t got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (got < 0) return errno == EINTR || errno == EAGAIN;
    int fds[MAX_FDS];
    size_t nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0)) continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (nfds < MAX_FDS)
                fds[nfds++] = fd;
            else
                close(fd);
        }
    }
    int more = got > 0;
    if (more) {
        struct request req = {0};
        const char *error = NULL;
        if (msg.msg_flags & MSG_TRUNC)
            error = "ValueError: the message is too long";
        else if ((error = parse_request(message, (size_t)got, &req)) == NULL && nfds != 3)
            error = "ValueError: a spawn request needs argv and three descriptors";
        if (error != NULL)
            answer('i', req.id, 'r', error);
        else
            spawn(&req, fds);
        free_request(&req);
    }
    for (size_t i = 0; i < nfds; i++) close(fds[i]);
    return more;
}

/* ---------------------------------------------------------------- exits and strays */

static int exit_code(int status) {
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

/* SIGTERM the orphans no live upstream owns (by session, else by marker), SIGKILL them after a grace;
 * `spared`: pids just sent SIGKILL (not ended twice). */
static void end_strays(const struct pids *spared) {
    size_t n;
    struct proc *all = processes(&n);
    struct pids doomed = {0};
    pid_t self = getpid();
    for (size_t i = 0; i < n; i++) {
        if (all[i].ppid != self || all[i].state == 'Z' || is_leader(all[i].pid)) continue;
        if ((spared != NULL && pids_has(spared, all[i].pid)) || is_leader(all[i].sid)) continue;
        if (marked_by_leader(all[i].pid)) continue;
        pids_add(&doomed, all[i].pid);
        descendants(all[i].pid, all, n, &doomed);
    }
    free(all);
    if (doomed.n == 0) return;
    kill_all(&doomed, SIGTERM);
    if (!grow((void **)&endings, &cap_endings, n_endings, sizeof *endings)) {
        kill_all(&doomed, SIGKILL);
        free(doomed.at);
        return;
    }
    endings[n_endings++] = (struct ending){now_ms() + TERM_GRACE_MS, doomed.at, doomed.n};
}

/* Report exited upstreams, then end what they left; reap adopted orphans too (only here while serving,
 * so no upstream's exit is ever collected without being reported). */
static void collect(void) {
    int exited = 0, status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (size_t i = 0; i < n_leaders; i++) {
            if (leaders[i].pid != pid) continue;
            leaders[i] = leaders[--n_leaders];
            char who[24], code[24];
            snprintf(who, sizeof who, "%d", (int)pid);
            snprintf(code, sizeof code, "%d", exit_code(status));
            answer('x', who, 'c', code);
            exited = 1;
            break;
        }
    }
    if (exited) end_strays(NULL);
}

/* SIGKILL what is left of the trees whose grace is over: only pids still below the guard (one that
 * ended, was reaped and was reused by another process is not ours). Then look for strays again: a
 * process of a doomed tree that forked during its grace and exited left its child to the guard, no
 * longer below any doomed pid. */
static void finish_ending(void) {
    long long now = now_ms();
    struct pids killed = {0};
    int due = 0;
    for (size_t i = 0; i < n_endings;) {
        if (endings[i].deadline > now) {
            i++;
            continue;
        }
        size_t n;
        struct proc *all = processes(&n);
        struct pids below = {0};
        descendants(getpid(), all, n, &below);
        for (size_t j = 0; j < endings[i].n; j++) {
            if (!pids_has(&below, endings[i].pids[j]) || pids_has(&killed, endings[i].pids[j])) continue;
            pids_add(&killed, endings[i].pids[j]);
            descendants(endings[i].pids[j], all, n, &killed);
        }
        free(all);
        free(below.at);
        free(endings[i].pids);
        endings[i] = endings[--n_endings];
        due = 1;
    }
    kill_all(&killed, SIGKILL);
    if (due) end_strays(&killed);
    free(killed.at);
}

static int poll_timeout(void) {
    if (n_endings == 0) return -1;
    long long first = endings[0].deadline;
    for (size_t i = 1; i < n_endings; i++)
        if (endings[i].deadline < first) first = endings[i].deadline;
    long long left = first - now_ms();
    return left < 0 ? 0 : (int)left;
}

/* SIGTERM everything below the guard, wait a little, then SIGKILL what is left, again at every look
 * (what forked since the last one is ended too) until nothing is left or KILL_WAIT_MS has passed; reap. */
static void end_tree(void) {
    pid_t self = getpid();
    long long term_end = now_ms() + TERM_GRACE_MS, kill_end = term_end + KILL_WAIT_MS;
    int sig = SIGTERM;
    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        size_t n;
        struct proc *all = processes(&n);
        struct pids below = {0};
        descendants(self, all, n, &below);
        free(all);
        long long now = now_ms();
        if (sig == SIGTERM || now >= term_end) kill_all(&below, now >= term_end ? SIGKILL : sig);
        sig = 0; /* SIGTERM once; SIGKILL at every look after the grace */
        size_t left = below.n;
        free(below.at);
        if (left == 0 || now >= kill_end) return;
        sleep_ms(20);
    }
}

/* ---------------------------------------------------------------- main */

static void serve(int sigfd) {
    struct pollfd waits[2] = {{sock, POLLIN, 0}, {sigfd, POLLIN, 0}};
    for (;;) {
        if (poll(waits, 2, poll_timeout()) < 0 && errno != EINTR) return;
        if (waits[0].revents && !handle_message()) return;
        if (waits[1].revents) {
            struct signalfd_siginfo info;
            while (read(sigfd, &info, sizeof info) == (ssize_t)sizeof info)
                if (info.ssi_signo != SIGCHLD) return;
        }
        collect();
        finish_ending();
    }
}

static int parse_int(const char *text, long *value) {
    char *end;
    errno = 0;
    *value = strtol(text, &end, 10);
    return errno == 0 && end != text && *end == 0 && *value >= 0 && *value <= 0x7fffffff;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("aggregator-guard %s\n", GUARD_SOURCE_HASH);
        return 0;
    }
    long parent, fd;
    if (argc != 3 || !parse_int(argv[1], &parent) || !parse_int(argv[2], &fd)) {
        fprintf(stderr, "usage: guard PARENT_PID SOCKET_FD\n");
        return 2;
    }
    sock = (int)fd;
    if (fcntl(sock, F_SETFD, FD_CLOEXEC) < 0) {
        perror("aggregator-guard: socket");
        return 2;
    }
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) /* a sandbox refusing prctl */
        fprintf(stderr, "aggregator-guard: prctl: %s; orphans of upstreams are not contained\n", strerror(errno));
    if (getppid() != (pid_t)parent) return 1; /* the aggregator died before the guard started */
    sigset_t handled;
    sigemptyset(&handled);
    static const int watched[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP};
    for (size_t i = 0; i < sizeof watched / sizeof watched[0]; i++) {
        signal(watched[i], SIG_DFL); /* one ignored by whoever started us is still seen */
        sigaddset(&handled, watched[i]);
    }
    sigprocmask(SIG_BLOCK, &handled, NULL);
    int sigfd = signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigfd < 0) {
        perror("aggregator-guard: signalfd");
        return 2;
    }
    serve(sigfd);
    end_tree(); /* the watched signals stay blocked: whatever arrives now, the clean-up finishes */
    return 0;
}
