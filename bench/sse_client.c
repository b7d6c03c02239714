/* The long-stream cell's load generator (bench/long_streams.py compiles it with gcc into the run's
 * temporary directory): opens STREAMS connections to 127.0.0.1:PORT spread evenly over RAMP_MS, sends
 * each the request in REQUEST (the whole HTTP/1.1 request, as bytes), and reads every reply as an SSE
 * stream: HTTP status, chunked (or plain) body, events split at blank lines.  An event with a
 * "content" member is a token; the time between two tokens' arrivals on one stream is a gap.
 *
 *     sse_client PORT REQUEST STREAMS RAMP_MS TIMEOUT_S TOKENS
 *
 * A stream is good when its status was 200, it delivered TOKENS tokens and ended with data: [DONE]
 * within TIMEOUT_S of its start; anything else is an error (by kind).  Prints one JSON line: counts,
 * gap percentiles (microseconds), time to first token, stream duration, tokens per second. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

enum { HEAD, CHUNK_SIZE, CHUNK_DATA, CHUNK_CRLF, PLAIN, END };
enum { E_CONNECT, E_STATUS, E_CLOSED, E_SHORT, E_TIMEOUT, E_KINDS };
static const char *kinds[E_KINDS] = {"connect", "status", "closed", "short", "timeout"};

typedef struct {
    int fd, state, status, chunked, done, finished;
    size_t chunk_left, head_n, ev_n;
    long plain_left;               /* content-length of a plain body, -1: until close */
    int ev_content;                /* the current event has a "content" member */
    int tokens;
    double t_start, t_first, t_last;
    char head[8192];
    char ev[64];                   /* the current event's tail: enough to see the markers across reads */
} stream_t;

static stream_t *st;
static int nstreams, want_tokens, finished, errors[E_KINDS], good;
static uint32_t *gaps, *ttft, *dur;
static size_t ngaps, nttft, ndur;
static uint64_t tokens_total;
static double t_first_token = -1, t_last_token;
static char *request;
static size_t request_n;
static int ep;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void finish(stream_t *s, int err) {
    if (s->finished) return;
    s->finished = 1;
    finished++;
    if (err >= 0) errors[err]++;
    else { good++; dur[ndur++] = (uint32_t)((s->t_last - s->t_start) * 1e6); }
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
}

/* One byte of decoded body into the SSE event scanner. */
static void event_byte(stream_t *s, char ch, double t) {
    if (ch == '\r') return;
    if (ch == '\n' && s->ev_n && s->ev[s->ev_n - 1] == '\n') { /* blank line: the event is complete */
        if (s->ev_content) {
            s->tokens++;
            tokens_total++;
            if (s->tokens == 1) { s->t_first = t; ttft[nttft++] = (uint32_t)((t - s->t_start) * 1e6); }
            else gaps[ngaps++] = (uint32_t)((t - s->t_last) * 1e6);
            s->t_last = t;
            if (t_first_token < 0) t_first_token = t;
            t_last_token = t;
        }
        s->ev_n = 0;
        s->ev_content = 0;
        return;
    }
    if (s->ev_n == sizeof s->ev) { memmove(s->ev, s->ev + 32, sizeof s->ev - 32); s->ev_n -= 32; }
    s->ev[s->ev_n++] = ch;
    if (ch == ':' && s->ev_n >= 10 && memcmp(s->ev + s->ev_n - 10, "\"content\":", 10) == 0) s->ev_content = 1;
    if (ch == ']' && s->ev_n >= 12 && memcmp(s->ev + s->ev_n - 12, "data: [DONE]", 12) == 0) s->done = 1;
}

static void body_end(stream_t *s) {
    if (s->done && s->tokens == want_tokens) finish(s, -1);
    else finish(s, E_SHORT);
}

static int parse_head(stream_t *s) {
    char *end = memmem(s->head, s->head_n, "\r\n\r\n", 4);
    if (!end) return 0;
    *end = '\0';
    s->status = atoi(s->head + 9);
    s->plain_left = -1;
    for (char *p = strchr(s->head, '\n'); p; p = strchr(p + 1, '\n')) {
        if (strncasecmp(p + 1, "transfer-encoding:", 18) == 0 && strcasestr(p, "chunked")) s->chunked = 1;
        if (strncasecmp(p + 1, "content-length:", 15) == 0) s->plain_left = atol(p + 16);
    }
    return (int)(end + 4 - s->head);
}

static void on_bytes(stream_t *s, const char *p, size_t n, double t) {
    size_t i = 0;
    if (s->state == HEAD) {
        size_t take = n < sizeof s->head - 1 - s->head_n ? n : sizeof s->head - 1 - s->head_n;
        memcpy(s->head + s->head_n, p, take);
        s->head_n += take;
        int used = parse_head(s);
        if (!used) { if (s->head_n == sizeof s->head - 1) finish(s, E_STATUS); return; }
        if (s->status != 200) { finish(s, E_STATUS); return; }
        i = take - (s->head_n - (size_t)used);
        s->state = s->chunked ? CHUNK_SIZE : PLAIN;
    }
    for (; i < n && !s->finished; i++) {
        char ch = p[i];
        switch (s->state) {
        case CHUNK_SIZE:
            if (ch == '\n') {
                if (s->chunk_left == 0) { body_end(s); return; }
                s->state = CHUNK_DATA;
            } else if (ch != '\r') {
                int v = ch >= '0' && ch <= '9' ? ch - '0' : (ch | 32) >= 'a' && (ch | 32) <= 'f' ? (ch | 32) - 'a' + 10 : -1;
                if (v >= 0) s->chunk_left = s->chunk_left * 16 + (size_t)v;
            }
            break;
        case CHUNK_DATA:
            event_byte(s, ch, t);
            if (--s->chunk_left == 0) s->state = CHUNK_CRLF;
            break;
        case CHUNK_CRLF:
            if (ch == '\n') s->state = CHUNK_SIZE;
            break;
        case PLAIN:
            event_byte(s, ch, t);
            if (s->plain_left > 0 && --s->plain_left == 0) { body_end(s); return; }
            break;
        }
    }
}

static void open_stream(int i, int port) {
    stream_t *s = &st[i];
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    s->t_start = now();
    if (connect(s->fd, (struct sockaddr *)&a, sizeof a) < 0 && errno != EINPROGRESS) { finish(s, E_CONNECT); return; }
    struct epoll_event ev = {EPOLLOUT, {.u32 = (uint32_t)i}};
    epoll_ctl(ep, EPOLL_CTL_ADD, s->fd, &ev);
}

static void on_event(int i, uint32_t events) {
    stream_t *s = &st[i];
    if (s->finished) return;
    if (events & EPOLLOUT) { /* connected: the request is small enough for one write */
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err || write(s->fd, request, request_n) != (ssize_t)request_n) { finish(s, E_CONNECT); return; }
        struct epoll_event ev = {EPOLLIN, {.u32 = (uint32_t)i}};
        epoll_ctl(ep, EPOLL_CTL_MOD, s->fd, &ev);
        return;
    }
    char buf[65536];
    for (;;) {
        ssize_t r = read(s->fd, buf, sizeof buf);
        if (r > 0) { on_bytes(s, buf, (size_t)r, now()); if (s->finished) return; continue; }
        if (r < 0 && errno == EAGAIN) return;
        if (s->state == PLAIN && s->plain_left < 0) body_end(s);
        else finish(s, s->state == HEAD ? E_STATUS : E_CLOSED);
        return;
    }
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static uint32_t pct(uint32_t *v, size_t n, double q) {
    if (!n) return 0;
    size_t k = (size_t)(q * (double)(n - 1) + 0.5);
    return v[k];
}

static void print_dist(const char *name, uint32_t *v, size_t n) {
    qsort(v, n, sizeof *v, cmp_u32);
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    printf(",\"%s_n\":%zu,\"%s_mean_us\":%.0f,\"%s_p50_us\":%u,\"%s_p90_us\":%u,\"%s_p99_us\":%u,"
           "\"%s_p999_us\":%u,\"%s_max_us\":%u", name, n, name, n ? sum / (double)n : 0.0, name, pct(v, n, .5),
           name, pct(v, n, .9), name, pct(v, n, .99), name, pct(v, n, .999), name, n ? v[n - 1] : 0);
}

int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: %s PORT REQUEST STREAMS RAMP_MS TIMEOUT_S TOKENS\n", argv[0]); return 2; }
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    int port = atoi(argv[1]);
    FILE *f = fopen(argv[2], "rb");
    if (!f) { perror(argv[2]); return 1; }
    request = malloc(1 << 20);
    request_n = fread(request, 1, 1 << 20, f);
    fclose(f);
    nstreams = atoi(argv[3]);
    double ramp = atof(argv[4]) / 1000.0, timeout = atof(argv[5]);
    want_tokens = atoi(argv[6]);
    st = calloc((size_t)nstreams, sizeof *st);
    gaps = calloc((size_t)nstreams * (size_t)(want_tokens + 8), sizeof *gaps);
    ttft = calloc((size_t)nstreams, sizeof *ttft);
    dur = calloc((size_t)nstreams, sizeof *dur);
    ep = epoll_create1(0);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct itimerspec its = {{0, 1000000}, {0, 1000000}};
    timerfd_settime(tfd, 0, &its, NULL);
    struct epoll_event tev = {EPOLLIN, {.u32 = UINT32_MAX}};
    epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &tev);

    double t0 = now(), next_check = t0;
    int opened = 0;
    struct epoll_event evs[1024];
    while (finished < nstreams) {
        int n = epoll_wait(ep, evs, 1024, 50);
        for (int k = 0; k < n; k++) {
            if (evs[k].data.u32 != UINT32_MAX) { on_event((int)evs[k].data.u32, evs[k].events); continue; }
            uint64_t exp;
            if (read(tfd, &exp, sizeof exp) < 0) continue;
            double t = now();
            int due = ramp > 0 ? (int)((t - t0) / ramp * nstreams) + 1 : nstreams;
            while (opened < nstreams && opened < due) open_stream(opened++, port);
            if (t < next_check) continue;
            next_check = t + 0.1; /* the deadline, checked every 100 ms */
            for (int i = 0; i < opened; i++)
                if (!st[i].finished && t - st[i].t_start > timeout) finish(&st[i], E_TIMEOUT);
        }
    }
    double wall = now() - t0;
    printf("{\"streams\":%d,\"good\":%d,\"errors\":%d", nstreams, good, nstreams - good);
    for (int e = 0; e < E_KINDS; e++) printf(",\"errors_%s\":%d", kinds[e], errors[e]);
    double span = t_last_token - t_first_token;
    printf(",\"tokens\":%lu,\"wall_s\":%.3f,\"tokens_per_s\":%.1f", (unsigned long)tokens_total, wall,
           span > 0 ? (double)tokens_total / span : 0.0);
    print_dist("gap", gaps, ngaps);
    print_dist("ttft", ttft, nttft);
    print_dist("duration", dur, ndur);
    printf("}\n");
    return 0;
}
