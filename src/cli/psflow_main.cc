// The psflow binary: the command line of psflow/cli/main.h with the seed models.
#include "psflow/cli/main.h"

int main(int argc, char** argv) { return psflow::cli::Main(argc, argv); }
