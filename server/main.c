/*
 * main.c - cinfer-server's entry point. The program (flags, environment,
 * model loading, signals, drain) is cinfer_server_main in run.c, part of
 * the server library so that test programs can run the same server with
 * hooks (tests/integration/faulty_server.c runs it over a backend that
 * injects device faults).
 *
 *   cinfer-server --help
 */
#include "server/server.h"

int main(int argc, char **argv)
{
    return cinfer_server_main(argc, argv, NULL);
}
