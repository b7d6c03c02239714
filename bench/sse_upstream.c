/* The long-stream cell's model server (bench/long_streams.py compiles it with gcc into the run's
 * temporary directory): HTTP/1.1 on 127.0.0.1:PORT, every request answered with one SSE stream whose
 * frames come from FRAMES (frames separated by a NUL byte), one frame every CADENCE_MS milliseconds,
 * the first at once, as a chunked reply; the connection is kept alive after the stream.
 *
 *     sse_upstream PORT FRAMES CADENCE_MS
 *
 * One thread, epoll, and a 1 ms timerfd driving a wheel of CADENCE_MS slots: a stream that started at
 * tick t is sent its next frame at t + CADENCE_MS, t + 2 CADENCE_MS, ...  Frames are chunk-encoded once
 * at start and written straight from that memory.  On SIGTERM it prints one JSON line of counters:
 * "missed_ticks" (timer expirations that found the loop busy) shows whether it kept its cadence. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

typedef struct { char *p; size_t n; } buf_t;

typedef struct conn {
    int fd;
    int frame;            /* next frame to send; -1: not streaming */
    int slot;             /* wheel slot while streaming */
    const char *out;      /* unsent rest of the last write (static memory) */
    size_t out_n;
    size_t in_n;
    char in[16384];
    struct conn *next;    /* wheel list */
} conn_t;

static buf_t *frames;     /* chunk-encoded; frames[0] carries the status line and headers */
static int nframes;
static conn_t **wheel;
static int cadence;
static int ep;
static volatile sig_atomic_t stop;
static uint64_t streams, frames_sent, missed_ticks, busy_skips;

static buf_t chunk(const char *prefix, const char *data, size_t n, int last) {
    size_t cap = strlen(prefix) + n + 32;
    buf_t b = {malloc(cap), 0};
    b.n = (size_t)snprintf(b.p, cap, "%s%zx\r\n", prefix, n);
    memcpy(b.p + b.n, data, n);
    b.n += n;
    memcpy(b.p + b.n, last ? "\r\n0\r\n\r\n" : "\r\n", last ? 7 : 2);
    b.n += last ? 7 : 2;
    return b;
}

static void load(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    static char data[1 << 22];
    size_t n = fread(data, 1, sizeof data, f);
    fclose(f);
    frames = calloc(n + 1, sizeof *frames);
    const char *head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                       "transfer-encoding: chunked\r\n\r\n";
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && data[i] != '\0') continue;
        if (i > start) frames[nframes++] = (buf_t){data + start, i - start};
        start = i + 1;
    }
    for (int i = 0; i < nframes; i++)
        frames[i] = chunk(i ? "" : head, frames[i].p, frames[i].n, i == nframes - 1);
}

static void close_conn(conn_t *c) {
    close(c->fd);
    c->fd = -1;
    if (c->frame < 0) free(c); /* a streaming one is freed when its wheel slot comes round */
}

static void flush(conn_t *c) {
    while (c->out_n) {
        ssize_t w = write(c->fd, c->out, c->out_n);
        if (w < 0) {
            if (errno == EAGAIN) {
                struct epoll_event ev = {EPOLLIN | EPOLLOUT | EPOLLRDHUP, {.ptr = c}};
                epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                return;
            }
            c->out_n = 0;
            shutdown(c->fd, SHUT_RDWR);
            return;
        }
        c->out += w;
        c->out_n -= (size_t)w;
    }
    struct epoll_event ev = {EPOLLIN | EPOLLRDHUP, {.ptr = c}};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void send_frame(conn_t *c) {
    if (c->out_n) { busy_skips++; return; } /* the reader is behind: this tick's frame waits */
    c->out = frames[c->frame].p;
    c->out_n = frames[c->frame].n;
    c->frame++;
    frames_sent++;
    flush(c);
}

/* A whole request (headers and content-length body) in c->in: start its stream. */
static int request_complete(conn_t *c) {
    char *end = memmem(c->in, c->in_n, "\r\n\r\n", 4);
    if (!end) return 0;
    size_t body = 0;
    for (char *p = c->in; p < end; p++)
        if ((p == c->in || p[-1] == '\n') && strncasecmp(p, "content-length:", 15) == 0)
            body = strtoul(p + 15, NULL, 10);
    size_t need = (size_t)(end + 4 - c->in) + body;
    if (c->in_n < need) return 0;
    c->in_n -= need;
    memmove(c->in, c->in + need, c->in_n);
    return 1;
}

static uint64_t tick;

static void on_readable(conn_t *c) {
    for (;;) {
        if (c->in_n == sizeof c->in) { close_conn(c); return; }
        ssize_t r = read(c->fd, c->in + c->in_n, sizeof c->in - c->in_n);
        if (r == 0 || (r < 0 && errno != EAGAIN)) { close_conn(c); return; }
        if (r < 0) break;
        c->in_n += (size_t)r;
    }
    if (c->frame < 0 && request_complete(c)) {
        streams++;
        c->frame = 0;
        send_frame(c);
        c->slot = (int)(tick % (uint64_t)cadence);
        c->next = wheel[c->slot];
        wheel[c->slot] = c;
    }
}

static void run_slot(int slot) {
    conn_t **pp = &wheel[slot];
    while (*pp) {
        conn_t *c = *pp;
        if (c->fd >= 0 && c->frame < nframes) send_frame(c);
        if (c->fd < 0 || c->frame >= nframes) {
            *pp = c->next;
            c->frame = -1;
            if (c->fd < 0) free(c);
        } else {
            pp = &c->next;
        }
    }
}

static void on_term(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s PORT FRAMES CADENCE_MS\n", argv[0]); return 2; }
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    load(argv[2]);
    cadence = atoi(argv[3]);
    if (nframes < 1 || cadence < 1) { fprintf(stderr, "no frames or bad cadence\n"); return 2; }
    wheel = calloc((size_t)cadence, sizeof *wheel);

    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 4096)) { perror("listen"); return 1; }
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct itimerspec its = {{0, 1000000}, {0, 1000000}};
    timerfd_settime(tfd, 0, &its, NULL);
    ep = epoll_create1(0);
    struct epoll_event ev = {EPOLLIN, {.ptr = &ls}};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    ev.data.ptr = &tfd;
    epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev);

    struct epoll_event evs[512];
    while (!stop) {
        int n = epoll_wait(ep, evs, 512, 100);
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &tfd) {
                uint64_t exp = 0;
                if (read(tfd, &exp, sizeof exp) != sizeof exp) continue;
                missed_ticks += exp - 1;
                for (uint64_t k = 0; k < exp; k++) run_slot((int)(++tick % (uint64_t)cadence));
            } else if (p == &ls) {
                int fd;
                while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    conn_t *c = calloc(1, sizeof *c);
                    c->fd = fd;
                    c->frame = -1;
                    struct epoll_event cev = {EPOLLIN | EPOLLRDHUP, {.ptr = c}};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
                }
            } else {
                conn_t *c = p;
                if (c->fd < 0) continue;
                if (evs[i].events & EPOLLOUT) flush(c);
                if (c->fd >= 0 && evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) on_readable(c);
            }
        }
    }
    printf("{\"streams\":%lu,\"frames_sent\":%lu,\"missed_ticks\":%lu,\"ticks\":%lu,\"busy_skips\":%lu}\n",
           (unsigned long)streams, (unsigned long)frames_sent, (unsigned long)missed_ticks,
           (unsigned long)tick, (unsigned long)busy_skips);
    return 0;
}
