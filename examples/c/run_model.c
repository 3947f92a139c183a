/* Run a model exported by `ember export` from C, with no Python and nothing of ember.
 *
 * Build it against an export directory DIR of the model NAME (the prefix of its functions):
 *
 *   cc -O2 -IDIR -DMODEL=NAME run_model.c -LDIR -lNAME -Wl,-rpath,DIR -o run_model
 *   cc -O2 -IDIR -DMODEL=NAME run_model.c DIR/libNAME.a -lm -pthread -o run_model
 *
 * (the first links the shared library, the second the static one).
 *
 * and run it:
 *
 *   run_model WEIGHTS|-e [-d NAME=SIZE]... [-i INPUT.bin]... [-o OUTPUT_DIR] [-r REPEAT]
 *             [-t THREADS]
 *
 * (-e: the weights linked into the library, for a model exported with --embed-weights).
 * A model exported with run-time dims (`ember export --dynamic seq`) needs each of them:
 * -d seq=24 (NAME_set_dims; the sizes and shapes below are then the bound ones).
 * Each -i names a file holding one input's raw bytes (little-endian, C order, exactly the
 * input's size), in input order; without them every input is filled with a fixed pattern.
 * The program prints each output's name, shape and first values, and the median time of
 * REPEAT calls; with -o it writes each output's raw bytes to OUTPUT_DIR/output<j>.bin.
 * It exits with 0 on success, 1 on a model error (the message of NAME_last_error), 2 on
 * bad usage or files.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef MODEL
#error "compile with -DMODEL=<the model's prefix> and -I<its export directory>"
#endif
/* #include "MODEL.h" */
#define EM_STR2(text) #text
#define EM_STR(text) EM_STR2(text)
#include EM_STR(MODEL.h)

#define EM_CAT2(prefix, name) prefix##_##name
#define EM_CAT(prefix, name) EM_CAT2(prefix, name)
#define API(name) EM_CAT(MODEL, name)

#define MAX_FILES 64
#define MAX_DIMS 16

static double seconds_now(void)
{
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

static int compare_doubles(const void *a, const void *b)
{
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Read exactly `size` bytes of `path` into `buffer`; 0 on success. */
static int read_exactly(const char *path, void *buffer, size_t size)
{
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    fprintf(stderr, "cannot open input file '%s'\n", path);
    return 1;
  }
  const size_t got = fread(buffer, 1, size, file);
  const int extra = fgetc(file) != EOF;
  fclose(file);
  if (got != size || extra) {
    fprintf(stderr, "input file '%s' must hold exactly %zu bytes\n", path, size);
    return 1;
  }
  return 0;
}

/* The first few values of an output, printed by element type. */
static void print_values(const void *data, int dtype, size_t count)
{
  const size_t shown = count < 8 ? count : 8;
  for (size_t k = 0; k < shown; ++k) {
    switch (dtype) {
      case EMBER_DTYPE_FLOAT32: printf(" %.6g", ((const float *)data)[k]); break;
      case EMBER_DTYPE_FLOAT64: printf(" %.9g", ((const double *)data)[k]); break;
      case EMBER_DTYPE_INT64: printf(" %lld", (long long)((const int64_t *)data)[k]); break;
      case EMBER_DTYPE_INT32: printf(" %d", ((const int32_t *)data)[k]); break;
      case EMBER_DTYPE_UINT8: case EMBER_DTYPE_BOOL:
        printf(" %u", ((const uint8_t *)data)[k]); break;
      case EMBER_DTYPE_INT8: printf(" %d", ((const int8_t *)data)[k]); break;
      default: printf(" ?"); break;
    }
  }
  printf(count > shown ? " ...\n" : "\n");
}

int main(int argc, char **argv)
{
  const char *weights = NULL, *output_dir = NULL;
  int embedded = 0;
  const char *input_files[MAX_FILES];
  const char *dim_args[MAX_DIMS];
  int n_files = 0, n_dim_args = 0, repeat = 1, threads = 0;
  for (int a = 1; a < argc; ++a) {
    if (strcmp(argv[a], "-i") == 0 && a + 1 < argc && n_files < MAX_FILES)
      input_files[n_files++] = argv[++a];
    else if (strcmp(argv[a], "-d") == 0 && a + 1 < argc && n_dim_args < MAX_DIMS)
      dim_args[n_dim_args++] = argv[++a];
    else if (strcmp(argv[a], "-o") == 0 && a + 1 < argc)
      output_dir = argv[++a];
    else if (strcmp(argv[a], "-r") == 0 && a + 1 < argc)
      repeat = atoi(argv[++a]);
    else if (strcmp(argv[a], "-t") == 0 && a + 1 < argc)
      threads = atoi(argv[++a]);
    else if (strcmp(argv[a], "-e") == 0)
      embedded = 1;
    else if (weights == NULL && argv[a][0] != '-')
      weights = argv[a];
    else {
      fprintf(stderr, "usage: %s WEIGHTS|-e [-d NAME=SIZE]... [-i INPUT.bin]... "
              "[-o OUTPUT_DIR] [-r REPEAT] [-t THREADS]\n", argv[0]);
      return 2;
    }
  }
  const int n_in = API(num_inputs)(), n_out = API(num_outputs)();
  if ((weights == NULL) == !embedded || repeat < 1 || (n_files != 0 && n_files != n_in)) {
    fprintf(stderr, "usage: %s WEIGHTS|-e [-i INPUT.bin]... (none or %d) [-o OUTPUT_DIR] "
            "[-r REPEAT >= 1] [-t THREADS]\n", argv[0], n_in);
    return 2;
  }

  API(model) *model = NULL;
  const int opened = embedded ? API(create_embedded)(&model) : API(create)(weights, &model);
  if (opened != EMBER_OK) {
    fprintf(stderr, "%s\n", API(last_error)());
    return 1;
  }
  API(set_num_threads)(threads);
  const int n_dims = API(num_dims)();
  if (n_dims > 0) {  /* every run-time dim, by name */
    int64_t dims[MAX_DIMS];
    for (int d = 0; d < n_dims && d < MAX_DIMS; ++d) {
      const char *name = API(dim_name)(d);
      const size_t length = strlen(name);
      dims[d] = 0;
      for (int k = 0; k < n_dim_args; ++k)
        if (strncmp(dim_args[k], name, length) == 0 && dim_args[k][length] == '=')
          dims[d] = atoll(dim_args[k] + length + 1);
      if (dims[d] == 0) {
        fprintf(stderr, "the model takes the dim '%s' at run time: give -d %s=SIZE\n", name,
                name);
        API(destroy)(model);
        return 2;
      }
    }
    if (n_dims > MAX_DIMS || API(set_dims)(model, dims) != EMBER_OK) {
      fprintf(stderr, "%s\n", API(last_error)());
      API(destroy)(model);
      return 1;
    }
  }

  void **inputs = calloc((size_t)n_in + 1, sizeof *inputs);
  void **outputs = calloc((size_t)n_out + 1, sizeof *outputs);
  int status = inputs && outputs ? 0 : 2;
  for (int i = 0; status == 0 && i < n_in; ++i) {
    const size_t size = API(bound_input_nbytes)(model, i);
    inputs[i] = malloc(size ? size : 1);
    if (inputs[i] == NULL)
      status = 2;
    else if (n_files)
      status = read_exactly(input_files[i], inputs[i], size) ? 2 : 0;
    else if (API(input_dtype)(i) == EMBER_DTYPE_FLOAT32)
      for (size_t k = 0; k < size / sizeof(float); ++k)  /* a fixed, varied pattern */
        ((float *)inputs[i])[k] = (float)((int)(k * 7919 % 1000) - 500) / 500.0f;
    else
      memset(inputs[i], 0, size);
  }
  for (int j = 0; status == 0 && j < n_out; ++j) {
    const size_t size = API(bound_output_nbytes)(model, j);
    outputs[j] = malloc(size ? size : 1);
    if (outputs[j] == NULL)
      status = 2;
  }
  double *times = status == 0 ? malloc((size_t)repeat * sizeof *times) : NULL;
  if (status == 0 && times == NULL)
    status = 2;
  for (int r = 0; status == 0 && r < repeat; ++r) {
    const double start = seconds_now();
    if (API(run)(model, (const void *const *)inputs, outputs) != EMBER_OK) {
      fprintf(stderr, "%s\n", API(last_error)());
      status = 1;
    }
    times[r] = seconds_now() - start;
  }

  for (int j = 0; status == 0 && j < n_out; ++j) {
    const int rank = API(output_rank)(j);
    const int64_t *shape = API(bound_output_shape)(model, j);
    size_t count = 1;
    printf("output %d '%s' [", j, API(output_name)(j));
    for (int d = 0; d < rank; ++d) {
      printf(d ? ", %lld" : "%lld", (long long)shape[d]);
      count *= (size_t)shape[d];
    }
    printf("]:");
    print_values(outputs[j], API(output_dtype)(j), count);
    if (output_dir != NULL) {
      char path[4096];
      snprintf(path, sizeof path, "%s/output%d.bin", output_dir, j);
      FILE *file = fopen(path, "wb");
      const size_t size = API(bound_output_nbytes)(model, j);
      if (file == NULL || fwrite(outputs[j], 1, size, file) != size) {
        fprintf(stderr, "cannot write '%s'\n", path);
        status = 2;
      }
      if (file != NULL)
        fclose(file);
    }
  }
  if (status == 0) {
    qsort(times, (size_t)repeat, sizeof *times, compare_doubles);
    printf("%d call(s) on %d thread(s): median %.3f ms\n", repeat, API(get_num_threads)(),
           times[repeat / 2] * 1e3);
  }

  for (int i = 0; inputs && i < n_in; ++i)
    free(inputs[i]);
  for (int j = 0; outputs && j < n_out; ++j)
    free(outputs[j]);
  free(inputs);
  free(outputs);
  free(times);
  API(destroy)(model);
  return status;
}
