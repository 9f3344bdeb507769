/* A kernel-TCP delay line for bench_wan.py --link nfqueue (kernels without sch_netem).

       nfqdelay --delay-ms 40 --rate-mbit 1000 QUEUE [QUEUE...]

   Runs inside a router namespace whose iptables rules send every packet arriving on each side of the
   link to its own NFQUEUE (one queue per direction). Each packet is held, in arrival order, until it
   has crossed a bottleneck of --rate-mbit (a virtual clock per queue, as netem's `rate` with a deep
   queue; 0 = unlimited) and then --delay-ms more, and only then accepted: the one-way delay of a
   link, with the endpoints' own kernel TCP on both sides. Packets of one queue leave in the order
   they came (one FIFO per queue, released by batch verdicts, which accept every id up to one).

   GSO packets are queued whole (NFQA_CFG_F_GSO): a 64 KiB super-packet costs one message, so the
   line carries several Gbit/s on one core. Lengths come from the IPv4 header (its total length is
   the super-packet's). A packet that finds its FIFO full is dropped and counted.

   Prints "ready" on stdout once bound; on SIGTERM/SIGINT prints one JSON line of counters to stderr
   (per queue: packets, bytes, drops, most packets held at once, releases more than 1 ms late and the
   worst lateness)
   and exits, leaving the kernel to drop what it still holds. */

#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#define MAX_QUEUES 4
#define RING (1u << 18) /* packets held per queue: 5 MB in flight at 1 Gbit/s and 40 ms is ~3,500 */
#define KERNEL_QUEUE_LEN 200000

struct held { uint32_t id; int64_t due_ns; };

struct line {
    struct nfq_q_handle *qh;
    int num;
    struct held ring[RING];
    uint32_t head, tail; /* ring[head..tail) are held */
    int64_t next_free_ns; /* when the bottleneck is free again */
    uint64_t packets, bytes, drops, max_held, late_1ms;
    int64_t worst_late_ns;
};

static struct line lines[MAX_QUEUES];
static int nlines;
static int64_t delay_ns;
static double ns_per_byte; /* 0: unlimited */
static volatile sig_atomic_t stopping;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int on_packet(struct nfq_q_handle *qh, struct nfgenmsg *msg, struct nfq_data *nfa, void *data) {
    (void)msg;
    struct line *l = data;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(nfa);
    if (!ph) return 0;
    uint32_t id = ntohl(ph->packet_id);
    unsigned char *payload;
    int got = nfq_get_payload(nfa, &payload);
    uint32_t len = got > 0 ? (uint32_t)got : 0;
    if (got >= 20 && (payload[0] >> 4) == 4) len = ((uint32_t)payload[2] << 8) | payload[3];
    int64_t t = now_ns();
    if (l->tail - l->head >= RING) { /* never expected: the ring holds far more than the link does */
        l->drops++;
        return nfq_set_verdict(qh, id, NF_DROP, 0, NULL);
    }
    int64_t start = l->next_free_ns > t ? l->next_free_ns : t;
    l->next_free_ns = start + (int64_t)(len * ns_per_byte);
    l->ring[l->tail % RING] = (struct held){id, l->next_free_ns + delay_ns};
    l->tail++;
    l->packets++;
    l->bytes += len;
    if (l->tail - l->head > l->max_held) l->max_held = l->tail - l->head;
    return 0;
}

/* Accept every packet now due, one batch verdict per queue; returns ns until the next is due (-1: none). */
static int64_t release_due(void) {
    int64_t t = now_ns(), next = -1;
    for (int i = 0; i < nlines; i++) {
        struct line *l = &lines[i];
        uint32_t last = 0;
        int any = 0;
        while (l->head != l->tail && l->ring[l->head % RING].due_ns <= t) {
            struct held *h = &l->ring[l->head % RING];
            if (t - h->due_ns > l->worst_late_ns) l->worst_late_ns = t - h->due_ns;
            if (t - h->due_ns > 1000000) l->late_1ms++;
            last = h->id;
            any = 1;
            l->head++;
        }
        if (any) nfq_set_verdict_batch(l->qh, last, NF_ACCEPT);
        if (l->head != l->tail) {
            int64_t wait = l->ring[l->head % RING].due_ns - t;
            if (next < 0 || wait < next) next = wait;
        }
    }
    return next;
}

static void on_signal(int sig) { (void)sig; stopping = 1; }

int main(int argc, char **argv) {
    double delay_ms = 0, rate_mbit = 0;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i += 2) {
        if (i + 1 >= argc) break;
        if (!strcmp(argv[i], "--delay-ms")) delay_ms = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--rate-mbit")) rate_mbit = atof(argv[i + 1]);
        else { fprintf(stderr, "nfqdelay: unknown option %s\n", argv[i]); return 2; }
    }
    if (i >= argc || argc - i > MAX_QUEUES) {
        fprintf(stderr, "usage: nfqdelay [--delay-ms MS] [--rate-mbit MBIT] QUEUE [QUEUE...] (at most %d)\n", MAX_QUEUES);
        return 2;
    }
    delay_ns = (int64_t)(delay_ms * 1e6);
    ns_per_byte = rate_mbit > 0 ? 8e3 / rate_mbit : 0;

    struct nfq_handle *h = nfq_open();
    if (!h) { perror("nfqdelay: nfq_open"); return 1; }
    nfnl_rcvbufsiz(nfq_nfnlh(h), 64 << 20);
    for (; i < argc; i++) {
        struct line *l = &lines[nlines];
        l->num = atoi(argv[i]);
        l->qh = nfq_create_queue(h, l->num, on_packet, l);
        if (!l->qh) { fprintf(stderr, "nfqdelay: cannot bind queue %d: %s\n", l->num, strerror(errno)); return 1; }
        if (nfq_set_mode(l->qh, NFQNL_COPY_PACKET, 64) < 0) { perror("nfqdelay: nfq_set_mode"); return 1; }
        nfq_set_queue_maxlen(l->qh, KERNEL_QUEUE_LEN);
        if (nfq_set_queue_flags(l->qh, NFQA_CFG_F_GSO, NFQA_CFG_F_GSO) < 0)
            fprintf(stderr, "nfqdelay: no NFQA_CFG_F_GSO: GSO packets are segmented before queueing\n");
        nlines++;
    }
    int fd = nfq_fd(h);
    int one = 1;
    setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    /* Real time if allowed: a release should not wait for the shared machine's other work (the line
       itself needs little CPU and sleeps between packets). */
    struct sched_param sp = {.sched_priority = 10};
    if (sched_setscheduler(0, SCHED_FIFO, &sp) < 0) fprintf(stderr, "nfqdelay: not real time: %s\n", strerror(errno));
    printf("ready\n");
    fflush(stdout);

    static char buf[1 << 16];
    while (!stopping) {
        int64_t wait = release_due();
        struct timespec ts = {0}, *tsp = NULL;
        if (wait >= 0) { ts.tv_sec = wait / 1000000000; ts.tv_nsec = wait % 1000000000; tsp = &ts; }
        struct pollfd p = {fd, POLLIN, 0};
        if (ppoll(&p, 1, tsp, NULL) <= 0) continue;
        for (;;) {
            ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n < 0) break; /* EAGAIN (or an overrun: later batch verdicts accept what it lost) */
            nfq_handle_packet(h, buf, (int)n);
        }
    }
    fprintf(stderr, "{");
    for (int k = 0; k < nlines; k++) {
        struct line *l = &lines[k];
        fprintf(stderr, "%s\"queue %d\": {\"packets\": %llu, \"bytes\": %llu, \"drops\": %llu, \"max_held\": %llu, "
                "\"late_over_1ms\": %llu, \"worst_late_ms\": %.3f, \"still_held\": %u}", k ? ", " : "", l->num,
                (unsigned long long)l->packets, (unsigned long long)l->bytes, (unsigned long long)l->drops,
                (unsigned long long)l->max_held, (unsigned long long)l->late_1ms, l->worst_late_ns / 1e6,
                l->tail - l->head);
    }
    fprintf(stderr, "}\n");
    for (int k = 0; k < nlines; k++) nfq_destroy_queue(lines[k].qh);
    nfq_close(h);
    return 0;
}
